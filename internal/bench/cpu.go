package bench

import (
	"bufio"
	"bytes"
	"os"
	"strconv"
	"strings"
	"sync"
)

// cpuWindow measures how busy the machine's CPUs are between begin and
// end, from the aggregate "cpu" line of /proc/stat (Linux): every process
// counts, the database server and the broker included, which is what
// decides the latency on a shared machine.
type cpuWindow struct {
	mu      sync.Mutex
	started bool
	busy    uint64
	total   uint64
}

// begin takes the first reading.
func (c *cpuWindow) begin() {
	busy, total, ok := readCPUStat()
	c.mu.Lock()
	defer c.mu.Unlock()
	c.started, c.busy, c.total = ok, busy, total
}

// end returns the percentage of CPU time that was not idle since begin,
// or -1 if begin did not run or the system does not tell.
func (c *cpuWindow) end() float64 {
	busy, total, ok := readCPUStat()
	c.mu.Lock()
	defer c.mu.Unlock()
	if !ok || !c.started || total <= c.total {
		return -1
	}
	return 100 * float64(busy-c.busy) / float64(total-c.total)
}

// readCPUStat returns the busy and total jiffies of all CPUs.
func readCPUStat() (busy, total uint64, ok bool) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, 0, false
	}
	return parseCPUStat(b)
}

// parseCPUStat reads the aggregate "cpu" line of /proc/stat: user nice
// system idle iowait irq softirq steal guest guest_nice. Idle time is idle
// plus iowait; guest time is already counted in user and nice.
func parseCPUStat(b []byte) (busy, total uint64, ok bool) {
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 5 || f[0] != "cpu" {
			continue
		}
		var v [8]uint64
		for i := 0; i < len(v) && i+1 < len(f); i++ {
			n, err := strconv.ParseUint(f[i+1], 10, 64)
			if err != nil {
				return 0, 0, false
			}
			v[i] = n
		}
		for _, n := range v {
			total += n
		}
		idle := v[3] + v[4]
		return total - idle, total, true
	}
	return 0, 0, false
}
