package cli

import (
	"context"
	"net/http"
	"net/http/pprof"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/pflag"

	"github.com/outboxrelay/outbox"
	"github.com/outboxrelay/outbox/health"
	"github.com/outboxrelay/outbox/metrics/backlog"
	outboxprom "github.com/outboxrelay/outbox/metrics/prometheus"
)

// observeFlags are the relay's flags for what it exports besides its
// events: readiness, the store's backlog, profiling.
type observeFlags struct {
	readyGrace      time.Duration
	backlogInterval time.Duration
	backlogLimit    int
	pprof           bool
}

func (o *observeFlags) add(fs *pflag.FlagSet) {
	fs.DurationVar(&o.readyGrace, "ready-grace", health.GraceDefault, "/readyz answers 503 once the store or the broker has been unreachable this long")
	fs.DurationVar(&o.backlogInterval, "backlog-interval", backlog.IntervalDefault, "measure the store's backlog for /metrics this often")
	fs.IntVar(&o.backlogLimit, "backlog-limit", outbox.BacklogScanLimitDefault, "read at most this many outstanding messages per backlog measure (per-topic counts are exact below it)")
	fs.BoolVar(&o.pprof, "pprof", false, "also serve Go's profiles under /debug/pprof/ on --http-addr")
}

func (o *observeFlags) check(a *app) error {
	if err := a.positiveDuration("ready-grace", o.readyGrace); err != nil {
		return err
	}
	if o.backlogInterval < backlog.IntervalMin {
		return usagef("%s must be at least %v, got %v", a.flagRef("backlog-interval"), backlog.IntervalMin, o.backlogInterval)
	}
	return a.between("backlog-limit", o.backlogLimit, 1, outbox.BacklogScanLimitMax)
}

// observability is what the relay's HTTP server exports.
type observability struct {
	reg     *prometheus.Registry
	metrics *outboxprom.Metrics
	monitor *backlog.Monitor // nil when the store cannot measure its backlog
	checker *health.Checker  // set by watchRelay
	pprof   bool

	// leasesChanged asks for a backlog refresh when the relay's lease count
	// changes, so that outbox_relays_live and outbox_leases_held do not
	// read 0 for a whole --backlog-interval after start (issue 23).
	leasesChanged chan struct{}
	lastLeases    atomic.Int64
	refresherDone chan struct{}
	refresherStop context.CancelFunc
}

// newObservability registers the relay's event metrics and, when the store
// measures its backlog, the backlog gauges, on reg.
func (a *app) newObservability(reg *prometheus.Registry, store any, f *observeFlags) (*observability, error) {
	o := &observability{reg: reg, metrics: outboxprom.NewMetrics(), pprof: f.pprof}
	if err := o.metrics.Register(reg); err != nil {
		return nil, err
	}
	br, ok := store.(outbox.BacklogReader)
	if !ok {
		a.log.Info("the store does not measure its backlog: no backlog gauges")
		return o, nil
	}
	mon, err := backlog.New(br, backlog.Options{Interval: f.backlogInterval, Limit: f.backlogLimit, OnRefresh: o.metrics.InitBacklogTopics, Logger: a.log})
	if err != nil {
		return nil, usagef("%v", err)
	}
	if err := outboxprom.RegisterBacklog(reg, mon); err != nil {
		return nil, err
	}
	o.monitor = mon
	o.leasesChanged = make(chan struct{}, 1)
	return o, nil
}

// hook is the relay's Hook: the event metrics and the readiness checker's
// view of store errors. It reads o.checker, set before the relay starts.
func (o *observability) hook() outbox.Hook {
	metrics := o.metrics.Hook()
	o.lastLeases.Store(-1)
	return func(e outbox.Event) {
		metrics(e)
		if e.Kind == outbox.EventLeases && o.leasesChanged != nil && o.lastLeases.Swap(int64(e.Count)) != int64(e.Count) {
			select {
			case o.leasesChanged <- struct{}{}:
			default: // a refresh is asked for already
			}
		}
		if o.checker != nil {
			o.checker.Observe(e)
		}
	}
}

// watchRelay adds the readiness checker of relay and the relay's gauges.
func (o *observability) watchRelay(relay *outbox.Relay, pub outbox.Publisher, f *observeFlags) error {
	c, err := health.New(relay, pub, health.Options{Grace: f.readyGrace})
	if err != nil {
		return usagef("%v", err)
	}
	if err := outboxprom.RegisterRelay(o.reg, relay); err != nil {
		return err
	}
	if err := outboxprom.RegisterHealth(o.reg, c); err != nil {
		return err
	}
	o.checker = c
	return nil
}

// start starts the backlog monitor, if any, until stop.
func (o *observability) start(ctx context.Context) error {
	if o.monitor == nil {
		return nil
	}
	if err := o.monitor.Start(ctx); err != nil {
		return err
	}
	ctx, o.refresherStop = context.WithCancel(ctx)
	o.refresherDone = make(chan struct{})
	go func() {
		defer close(o.refresherDone)
		for {
			select {
			case <-ctx.Done():
				return
			case <-o.leasesChanged:
				// Partitions move in several rounds when relays join or
				// leave: refresh once they have settled (a quiet spell, or
				// leaseRefreshMax after the first change), not once per
				// round. Only the lease gauges changed: a store that reads
				// its leases alone does not scan up to --backlog-limit
				// rows again (in every relay, at every rebalance).
				if !o.quiet(ctx) {
					return
				}
				_ = o.monitor.RefreshLeases(ctx) // a failure is counted in the snapshot (the refresh errors counter of /metrics); the next periodic refresh logs one that persists
			}
		}
	}()
	return nil
}

// leaseRefreshQuiet and leaseRefreshMax bound the wait of a backlog
// refresh asked for by lease changes: it comes once no change came for
// leaseRefreshQuiet, and at the latest leaseRefreshMax after the first.
var (
	leaseRefreshQuiet = 500 * time.Millisecond
	leaseRefreshMax   = 3 * time.Second
)

// quiet waits until the lease changes stop for leaseRefreshQuiet, or
// leaseRefreshMax has passed; it reports false when ctx ends first.
func (o *observability) quiet(ctx context.Context) bool {
	limit := time.NewTimer(leaseRefreshMax)
	defer limit.Stop()
	for {
		spell := time.NewTimer(leaseRefreshQuiet)
		select {
		case <-ctx.Done():
			spell.Stop()
			return false
		case <-limit.C:
			spell.Stop()
			return true
		case <-spell.C:
			return true
		case <-o.leasesChanged:
			spell.Stop()
		}
	}
}

func (o *observability) stop() {
	if o.refresherStop != nil {
		o.refresherStop()
		<-o.refresherDone
	}
	if o.monitor != nil {
		o.monitor.Stop()
	}
}

// mount adds /readyz (the checker's JSON report) and, with --pprof,
// /debug/pprof/ to mux.
func (o *observability) mount(mux *http.ServeMux) {
	mux.Handle("GET /readyz", o.checker.Handler())
	if o.pprof {
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
		mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	}
}
