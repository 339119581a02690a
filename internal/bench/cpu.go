package bench

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
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

// ProcessCPU is the CPU time per message of each process over a run's
// timed span, in µs; -1 where the process is not part of the scenario or
// its CPU time cannot be read (a server on another machine).
//
//   - Postgres: the postmaster and its children (live backends, and those
//     that exited, through the postmaster's children times).
//   - Broker: the broker process the bench started (not an external one).
//   - Relay: the `outbox relay` processes together; for the scenarios that
//     run their processor in the bench's process (the seeds, the ceilings,
//     relay/wal) that process.
//   - Producers: the bench's process while its producers write (writer and
//     steady scenarios; in steady it also runs the latency consumer).
type ProcessCPU struct {
	Postgres  float64 `json:"postgres"`
	Broker    float64 `json:"broker"`
	Relay     float64 `json:"relay"`
	Producers float64 `json:"producers"`
}

// cpuRole says what the bench's own process does during a timed span.
type cpuRole int

const (
	benchWaits    cpuRole = iota // it only waits for the others
	benchRelays                  // it runs the processor (in-process)
	benchProduces                // it runs the producers
)

// cpuUse is the CPU time a run used, per process; a negative duration is
// not measured.
type cpuUse struct {
	// Client is the bench's process, Server PostgreSQL's.
	Client, Server time.Duration
	Broker         time.Duration
	// Relays holds each relay process's CPU time.
	Relays []time.Duration
	// stmts is what pg_stat_statements recorded, nil when not read.
	stmts *statementStats
}

// relay is the relay processes' CPU time together, or -1 when none ran.
func (c cpuUse) relay() time.Duration {
	if len(c.Relays) == 0 {
		return -1
	}
	var t time.Duration
	for _, r := range c.Relays {
		if r < 0 {
			return -1
		}
		t += r
	}
	return t
}

// perMessage divides c over n messages, with role saying what the bench's
// process did.
func (c cpuUse) perMessage(n int, role cpuRole) ProcessCPU {
	per := func(d time.Duration) float64 {
		if d < 0 || n <= 0 {
			return -1
		}
		return float64(d.Nanoseconds()) / 1e3 / float64(n)
	}
	p := ProcessCPU{Postgres: per(c.Server), Broker: per(c.Broker), Relay: per(c.relay()), Producers: -1}
	switch role {
	case benchRelays:
		p.Relay = per(c.Client)
	case benchProduces:
		p.Producers = per(c.Client)
	}
	return p
}

// setCPU records the CPU time per message of a run.
func (r *RunResult) setCPU(c cpuUse, role cpuRole) {
	r.ClientCPUMicros = float64(c.Client.Microseconds()) / float64(r.Messages)
	r.ServerCPUMicros = -1
	if c.Server >= 0 {
		r.ServerCPUMicros = float64(c.Server.Microseconds()) / float64(r.Messages)
	}
	cpu := c.perMessage(r.Messages, role)
	r.CPU = &cpu
	if c.stmts != nil {
		r.StatementCalls = c.stmts.calls
		r.Statements = c.stmts.top
		for i := range r.Statements {
			r.Statements[i].MicrosPerMsg = r.Statements[i].TotalMs * 1e3 / float64(max(1, r.Messages))
		}
	}
}

// cpuMeter reads the CPU time of the bench's process (getrusage), of the
// PostgreSQL server (the postmaster and its children, from /proc: only
// when the server runs on this machine and /proc tells), of the broker
// process the bench started and of relay processes.
type cpuMeter struct {
	ctx        context.Context
	env        *Env
	postmaster int // 0: unknown
	broker     *child
	relays     []*child

	client, server, brokerAt time.Duration
	relaysAt                 []time.Duration
}

func newCPUMeter(ctx context.Context, env *Env) *cpuMeter {
	m := &cpuMeter{ctx: ctx, env: env, postmaster: env.postmaster(ctx)}
	if env.Broker != nil {
		m.broker = env.Broker.proc
	}
	return m
}

// withoutBroker leaves the broker out: a scenario that does not publish.
func (m *cpuMeter) withoutBroker() *cpuMeter {
	m.broker = nil
	return m
}

// postmaster returns the PID of the PostgreSQL server's postmaster when it
// runs on this machine (found once), or 0.
func (e *Env) postmaster(ctx context.Context) int {
	e.postmasterOnce.Do(func() {
		var pid int
		// The checkpointer's parent is the postmaster.
		if err := e.Pool.QueryRow(ctx, `SELECT pid FROM pg_stat_activity WHERE backend_type = 'checkpointer'`).Scan(&pid); err == nil {
			if t, ok := procStat(pid); ok {
				e.postmasterPID = t.ppid
			}
		}
	})
	return e.postmasterPID
}

// add measures relay processes too: those started after begin count from
// zero.
func (m *cpuMeter) add(relays ...*child) {
	for _, c := range relays {
		m.relays = append(m.relays, c)
		m.relaysAt = append(m.relaysAt, 0)
	}
}

// begin resets pg_stat_statements (when the bench reads it) and takes the
// first readings.
func (m *cpuMeter) begin() {
	if m.env.statements {
		if err := m.env.resetStatements(m.ctx); err != nil {
			m.env.Log.Warn("bench: reset pg_stat_statements", "err", err)
		}
	}
	m.client, m.server, m.brokerAt = selfCPU(), m.serverCPU(), m.brokerCPU()
	for i, c := range m.relays {
		m.relaysAt[i] = childCPU(c)
	}
}

func (m *cpuMeter) end() cpuUse {
	u := cpuUse{Client: selfCPU() - m.client, Server: -1, Broker: -1}
	if s := m.serverCPU(); s >= 0 && m.server >= 0 {
		u.Server = s - m.server
	}
	if b := m.brokerCPU(); b >= 0 && m.brokerAt >= 0 {
		u.Broker = b - m.brokerAt
	}
	for i, c := range m.relays {
		t := childCPU(c)
		if t >= 0 {
			t -= m.relaysAt[i]
		}
		u.Relays = append(u.Relays, t)
	}
	if m.env.statements {
		st, err := m.env.readStatements(m.ctx)
		if err != nil {
			m.env.Log.Warn("bench: read pg_stat_statements", "err", err)
		}
		u.stmts = st
	}
	return u
}

func (m *cpuMeter) brokerCPU() time.Duration {
	if m.broker == nil {
		return -1
	}
	return childCPU(m.broker)
}

// childCPU is a child process's CPU time, or -1.
func childCPU(c *child) time.Duration {
	if t, ok := c.cpu(); ok {
		return t
	}
	return -1
}

func selfCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// serverCPU sums the CPU time of the postmaster and its children (the
// live ones from their /proc entries, the exited ones from the
// postmaster's children times), or -1.
func (m *cpuMeter) serverCPU() time.Duration {
	if m.postmaster == 0 {
		return -1
	}
	pm, ok := procStat(m.postmaster)
	if !ok {
		return -1
	}
	total := singleThreadCPU(m.postmaster, pm) + pm.children
	dirs, err := filepath.Glob("/proc/[0-9]*")
	if err != nil {
		return -1
	}
	for _, d := range dirs {
		pid, err := strconv.Atoi(filepath.Base(d))
		if err != nil {
			continue
		}
		if t, ok := procStat(pid); ok && t.ppid == m.postmaster {
			total += singleThreadCPU(pid, t)
		}
	}
	return total
}

// singleThreadCPU is the CPU time of a single-threaded process (such as
// PostgreSQL's): from /proc/<pid>/schedstat, in nanoseconds, where the
// kernel has it, else t's (whole clock ticks: summed over the dozens of
// short-lived backends of a short run, truncating each to 10 ms loses most
// of it).
func singleThreadCPU(pid int, t procTimes) time.Duration {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/schedstat", pid))
	if err != nil {
		return t.cpu
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return t.cpu
	}
	ns, err := strconv.ParseInt(f[0], 10, 64)
	if err != nil {
		return t.cpu
	}
	return time.Duration(ns)
}

// clockTicks is the unit of /proc/<pid>/stat times (USER_HZ, 100 on
// Linux).
const clockTicks = 100

// procTimes is what the bench reads of /proc/<pid>/stat.
type procTimes struct {
	ppid int
	// cpu is the process's user + system time, children the user + system
	// time of its children that exited and were waited for.
	cpu, children time.Duration
}

// procStat reads a process's parent and CPU times from /proc/<pid>/stat.
func procStat(pid int) (procTimes, bool) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return procTimes{}, false
	}
	return parseProcStat(string(b))
}

func parseProcStat(line string) (procTimes, bool) {
	// pid (comm) state ppid … utime stime cutime cstime: comm may hold
	// spaces.
	i := strings.LastIndexByte(line, ')')
	if i < 0 {
		return procTimes{}, false
	}
	f := strings.Fields(line[i+1:])
	if len(f) < 15 {
		return procTimes{}, false
	}
	ppid, err := strconv.Atoi(f[1])
	if err != nil {
		return procTimes{}, false
	}
	var v [4]int64
	for j := range v {
		if v[j], err = strconv.ParseInt(f[11+j], 10, 64); err != nil {
			return procTimes{}, false
		}
	}
	tick := func(n int64) time.Duration { return time.Duration(n) * time.Second / clockTicks }
	return procTimes{ppid: ppid, cpu: tick(v[0] + v[1]), children: tick(v[2] + v[3])}, true
}
