package bench

import "testing"

func TestParseCPUStat(t *testing.T) {
	stat := []byte(`cpu  100 5 50 800 20 3 2 10 7 0
cpu0 50 2 25 400 10 1 1 5 3 0
intr 12345
`)
	busy, total, ok := parseCPUStat(stat)
	if !ok {
		t.Fatal("parseCPUStat: not ok")
	}
	// user nice system idle iowait irq softirq steal: guest is in user.
	if wantTotal := uint64(100 + 5 + 50 + 800 + 20 + 3 + 2 + 10); total != wantTotal {
		t.Errorf("total = %d, want %d", total, wantTotal)
	}
	if wantBusy := uint64(100 + 5 + 50 + 3 + 2 + 10); busy != wantBusy {
		t.Errorf("busy = %d, want %d", busy, wantBusy)
	}
	for _, bad := range []string{"", "intr 1 2 3\n", "cpu 1 x 3 4 5\n"} {
		if _, _, ok := parseCPUStat([]byte(bad)); ok {
			t.Errorf("parseCPUStat(%q) ok, want not ok", bad)
		}
	}
}

func TestCPUWindow(t *testing.T) {
	var c cpuWindow
	if got := c.end(); got != -1 {
		t.Errorf("end without begin = %v, want -1", got)
	}
	_, before, ok := readCPUStat()
	c.begin()
	if !ok {
		// No /proc/stat on this system: the bench reports -1.
		if got := c.end(); got != -1 {
			t.Errorf("end without /proc/stat = %v, want -1", got)
		}
		return
	}
	// Spin until the kernel's counters move (a tick is 10 ms or less).
	for {
		if _, now, _ := readCPUStat(); now > before+1 {
			break
		}
	}
	if got := c.end(); !(got >= 0 && got <= 100) {
		t.Errorf("end = %v, want a percentage", got)
	}
}
