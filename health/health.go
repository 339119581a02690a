// Package health answers readiness for a relay: is the relay running,
// does it reach its store and its broker, which destinations are blocked.
//
//	checker, err := health.New(relay, pub, health.Options{})
//	cfg.Hook = … checker.Observe … // to report the store's last error
//	mux.Handle("GET /readyz", checker.Handler())
//
// The store is reachable while the relay's store round trips succeed
// ([outbox.Relay.LastStoreContact] is recent: within two heartbeat
// intervals and a poll interval). The broker is reachable while the
// publisher's Health returns nil (publishers that implement
// [outbox.HealthChecker]: natsjs, rabbitmq, kafka; for others the broker
// is not checked). Either may be unreachable for up to Options.Grace
// before readiness fails, so that a blip does not take the relay out of
// service. Blocked destinations are reported but do not fail readiness:
// the relay keeps publishing to the others. When every destination is
// blocked (at least one is, and nothing was published since the last one
// was), the report says so (AllBlocked, Detail) and readiness still does
// not fail: taking the relay out of service or restarting it creates no
// stream, topic or queue; outbox_all_destinations_blocked and the shipped
// alert OutboxAllDestinationsBlocked page instead.
package health

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/outboxrelay/outbox"
)

// Defaults of [Options].
const (
	// GraceDefault is how long the store or the broker may be unreachable
	// before readiness fails.
	GraceDefault = 10 * time.Second
	// ProbeTimeoutDefault bounds one broker health probe.
	ProbeTimeoutDefault = 2 * time.Second
	// ProbeIntervalDefault is how long a broker probe's result is reused.
	ProbeIntervalDefault = time.Second
)

// Relay is what the checker needs of an [outbox.Relay].
type Relay interface {
	Running() bool
	LastStoreContact() time.Time
	Blocked() []outbox.BlockedDestination
	Config() outbox.Config
}

// Options configures a [Checker]. The zero value is valid.
type Options struct {
	// Grace is how long the store or the broker may be unreachable before
	// readiness fails (default GraceDefault; a nanosecond fails at once).
	Grace time.Duration
	// ProbeTimeout bounds one broker probe (default ProbeTimeoutDefault).
	ProbeTimeout time.Duration
	// ProbeInterval is how long a broker probe's result is reused by later
	// checks (default ProbeIntervalDefault), so that frequent probes and
	// scrapes do not multiply requests to the broker.
	ProbeInterval time.Duration
	// Now is the clock (default time.Now).
	Now func() time.Time
}

// Checker answers readiness for one relay. Its methods are safe for
// concurrent use.
type Checker struct {
	relay  Relay
	broker outbox.HealthChecker // nil: not checked
	opts   Options
	start  time.Time
	stale  time.Duration // store contact older than this: unreachable

	mu          sync.Mutex
	probedAt    time.Time
	brokerErr   error
	brokerSince time.Time // first failed probe of the current failure
	storeErr    string    // the last store error the relay reported
	published   time.Time // the last EventPublished or EventDuplicate
}

// New returns a Checker of relay, probing pub's broker when pub
// implements [outbox.HealthChecker]. The error names the option to change.
func New(relay Relay, pub outbox.Publisher, opts Options) (*Checker, error) {
	if relay == nil {
		return nil, errors.New("health: New needs a relay")
	}
	opts.Grace = cmp.Or(opts.Grace, GraceDefault)
	opts.ProbeTimeout = cmp.Or(opts.ProbeTimeout, ProbeTimeoutDefault)
	opts.ProbeInterval = cmp.Or(opts.ProbeInterval, ProbeIntervalDefault)
	if opts.Now == nil {
		opts.Now = time.Now
	}
	switch {
	case opts.Grace < 0:
		return nil, fmt.Errorf("health: Options.Grace must be positive, got %v", opts.Grace)
	case opts.ProbeTimeout < 0:
		return nil, fmt.Errorf("health: Options.ProbeTimeout must be positive, got %v", opts.ProbeTimeout)
	case opts.ProbeInterval < 0:
		return nil, fmt.Errorf("health: Options.ProbeInterval must be positive, got %v", opts.ProbeInterval)
	}
	cfg := relay.Config()
	c := &Checker{relay: relay, opts: opts, start: opts.Now(), stale: 2*cfg.HeartbeatInterval + cfg.PollInterval}
	c.broker, _ = pub.(outbox.HealthChecker)
	return c, nil
}

// Report is the answer of a check, the body of /readyz.
type Report struct {
	// Ready is false when the relay is not running, or the store or the
	// broker has been unreachable for longer than the grace period.
	Ready bool `json:"ready"`
	// Relay is "running" or "stopped".
	Relay  string    `json:"relay"`
	Store  Component `json:"store"`
	Broker Component `json:"broker"`
	// Blocked lists the destinations the relay holds paused; they do not
	// make the relay unready.
	Blocked []outbox.BlockedDestination `json:"blocked_destinations"`
	// AllBlocked is true when at least one destination is blocked and
	// nothing was published since the last one was: nothing at all goes
	// out. It does not make the relay unready either.
	AllBlocked bool `json:"all_destinations_blocked"`
	// Detail says in words what is wrong, when something is.
	Detail string `json:"detail,omitempty"`
}

// Component is the state of the store or the broker.
type Component struct {
	// Status is "ok", "unreachable" (within the grace period),
	// "down" (unreachable for longer: the relay is not ready) or
	// "unchecked" (a publisher without Health).
	Status string `json:"status"`
	// Since is when it was first found unreachable (the last successful
	// round trip, for the store); zero while ok.
	Since time.Time `json:"since,omitzero"`
	// Error says what is wrong, when known.
	Error string `json:"error,omitempty"`
}

// Up reports whether the component is reachable (ok or unchecked).
func (c Component) Up() bool { return c.Status == statusOK || c.Status == statusUnchecked }

const (
	statusOK          = "ok"
	statusUnreachable = "unreachable"
	statusDown        = "down"
	statusUnchecked   = "unchecked"
)

// Observe records what a relay event says: pass it every event of the
// relay's Hook (it does not block). EventStoreError gives the error text of
// the report; EventPublished and EventDuplicate tell whether anything goes
// out while destinations are blocked.
func (c *Checker) Observe(e outbox.Event) {
	switch {
	case e.Kind == outbox.EventStoreError && e.Err != nil:
		c.mu.Lock()
		c.storeErr = e.Err.Error()
		c.mu.Unlock()
	case e.Kind == outbox.EventPublished || e.Kind == outbox.EventDuplicate:
		now := c.opts.Now()
		c.mu.Lock()
		c.published = now
		c.mu.Unlock()
	}
}

// Check returns the readiness report now, probing the broker unless a
// probe within ProbeInterval answered already.
func (c *Checker) Check(ctx context.Context) Report {
	now := c.opts.Now()
	r := Report{Relay: "stopped", Blocked: c.relay.Blocked()}
	if r.Blocked == nil {
		r.Blocked = []outbox.BlockedDestination{}
	}
	running := c.relay.Running()
	if running {
		r.Relay = "running"
	}
	r.Store = c.store(now)
	r.Broker = c.probe(ctx, now)
	r.Ready = running && r.Store.Status != statusDown && r.Broker.Status != statusDown
	if len(r.Blocked) > 0 {
		c.mu.Lock()
		r.AllBlocked = c.published.Before(latestSince(r.Blocked))
		c.mu.Unlock()
	}
	switch {
	case r.AllBlocked:
		b := r.Blocked[0]
		r.Detail = fmt.Sprintf("every destination is blocked: nothing was published since %s; %s: %s (create what the relay publishes to, for instance with outbox destinations create)",
			latestSince(r.Blocked).Format(time.RFC3339), b.Destination, b.LastError)
	case !r.Ready && !running:
		r.Detail = "the relay is not running"
	case r.Store.Status == statusDown:
		r.Detail = "the store is unreachable: " + r.Store.Error
	case r.Broker.Status == statusDown:
		r.Detail = "the broker is unreachable: " + r.Broker.Error
	case len(r.Blocked) > 0:
		r.Detail = fmt.Sprintf("%d destination(s) blocked; the others are published to", len(r.Blocked))
	}
	return r
}

func latestSince(bs []outbox.BlockedDestination) time.Time {
	var latest time.Time
	for _, b := range bs {
		if b.Since.After(latest) {
			latest = b.Since
		}
	}
	return latest
}

func (c *Checker) store(now time.Time) Component {
	last := c.relay.LastStoreContact()
	since := last
	if since.IsZero() {
		since = c.start // never reached it
	}
	if !last.IsZero() && now.Sub(last) < c.stale {
		return Component{Status: statusOK}
	}
	comp := Component{Status: statusUnreachable, Since: since}
	if now.Sub(since) >= c.stale+c.opts.Grace {
		comp.Status = statusDown
	}
	c.mu.Lock()
	comp.Error = c.storeErr
	c.mu.Unlock()
	if comp.Error == "" {
		comp.Error = fmt.Sprintf("no successful store round trip since %s", since.Format(time.RFC3339))
	}
	return comp
}

func (c *Checker) probe(ctx context.Context, now time.Time) Component {
	if c.broker == nil {
		return Component{Status: statusUnchecked}
	}
	c.mu.Lock()
	fresh := !c.probedAt.IsZero() && now.Sub(c.probedAt) < c.opts.ProbeInterval
	c.mu.Unlock()
	if !fresh {
		pctx, cancel := context.WithTimeout(ctx, c.opts.ProbeTimeout)
		err := c.broker.Health(pctx)
		cancel()
		c.mu.Lock()
		c.probedAt, c.brokerErr = now, err
		switch {
		case err == nil:
			c.brokerSince = time.Time{}
		case c.brokerSince.IsZero():
			c.brokerSince = now
		}
		c.mu.Unlock()
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.brokerErr == nil {
		return Component{Status: statusOK}
	}
	comp := Component{Status: statusUnreachable, Since: c.brokerSince, Error: c.brokerErr.Error()}
	if now.Sub(c.brokerSince) >= c.opts.Grace {
		comp.Status = statusDown
	}
	return comp
}

// Handler serves the report as JSON: 200 when ready, 503 when not.
func (c *Checker) Handler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		r := c.Check(req.Context())
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Cache-Control", "no-store")
		if !r.Ready {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		_ = enc.Encode(r)
	})
}
