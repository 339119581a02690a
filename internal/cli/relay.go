package cli

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/spf13/cobra"

	"github.com/outboxrelay/outbox"
	"github.com/outboxrelay/outbox/internal/backends"
	outboxprom "github.com/outboxrelay/outbox/metrics/prometheus"
)

// HTTPAddrDefault is where `outbox relay` serves /healthz, /readyz and
// /metrics unless --http-addr says otherwise. Port 7467 stays clear of
// Prometheus's own ports (9090 to 9094), of the exporter range 9100 to 9999
// (all of it allocated), and of the ports development servers like (3000,
// 8000, 8080).
const HTTPAddrDefault = "127.0.0.1:7467"

// httpShutdownTimeout bounds the HTTP server's graceful shutdown.
const httpShutdownTimeout = 5 * time.Second

type relayFlags struct {
	store    storeFlags
	broker   string
	security brokerSecurityFlags

	maxInFlight   int
	ackTimeout    time.Duration
	subjectPrefix string

	workers         int
	batch           int
	inFlight        int
	ordering        string
	orderScope      string
	publishTimeout  time.Duration
	leaseTTL        time.Duration
	maxAttempts     int
	onPermanent     string
	shutdownTimeout time.Duration
	pollInterval    time.Duration
	node            string
	httpAddr        string
	observe         observeFlags
	console         consoleFlags
	otel            otelFlags
	cloudEvents     ceFlags

	createDestinations backends.DestinationSpec // Topics from --create-destinations
}

const brokerExample = "nats://localhost:4222"

func newRelayCommand(a *app) *cobra.Command {
	var f relayFlags
	cmd := &cobra.Command{
		Use:   "relay --store URL --broker URL",
		Short: "Run the relay: publish the outbox to the broker until stopped",
		Long: `relay publishes the messages of the outbox to the broker until it gets SIGINT
or SIGTERM; then it finishes and settles the batches in hand (bounded by
--shutdown-timeout), hands its partitions back and exits 0. Run as many relay
processes as you like: they share the partitions, and messages of one key are
still published in commit order.

While it runs it serves on --http-addr:
  /healthz  200 while the process runs
  /readyz   200 while the relay runs and reaches its store and its broker;
            503 once either has been unreachable for --ready-grace, or the
            relay stopped. The JSON body says which, and lists blocked
            destinations (which do not fail readiness).
  /metrics  Prometheus metrics: the relay's counters (outbox_published_total,
            …) and the store's backlog measured every --backlog-interval
            (outbox_outstanding_messages, outbox_lag_seconds, …)
  /debug/pprof/  Go's profiles, with --pprof only
  /         the web console, with --console (see outbox console --help)
Port 0 picks a free port; the address is logged ("http listening").`,
		Example: `  outbox relay --store postgres://app@localhost:5432/app --broker nats://localhost:4222
  outbox relay --store postgres://app@localhost:5432/app --broker nats://localhost:4222 --create-destinations 'orders.>' --stream ORDERS
  OUTBOX_STORE=postgres://… OUTBOX_BROKER=nats://… outbox relay --workers 8 --log-format json`,
		Args: cobra.NoArgs,
	}
	fs := cmd.Flags()
	f.store.add(fs, storeFlagSet{retention: true})
	fs.StringVar(&f.broker, "broker", "", "broker URL, such as "+brokerExample)
	f.security.add(fs)
	fs.IntVar(&f.maxInFlight, "max-in-flight", 0, "publishes awaiting an acknowledgement, per publisher (0: the broker's default)")
	fs.DurationVar(&f.ackTimeout, "ack-timeout", 0, "wait for one broker acknowledgement at most this long (0: the broker's default)")
	fs.StringVar(&f.subjectPrefix, "subject-prefix", "", "put this right before every topic, usually ending with a dot (outbox. sends orders.created to outbox.orders.created)")
	fs.IntVar(&f.workers, "workers", outbox.WorkersDefault, "batches built and published concurrently")
	fs.IntVar(&f.batch, "batch", outbox.BatchSizeDefault, "messages per publish batch")
	fs.IntVar(&f.inFlight, "in-flight", outbox.InFlightDefault, "publish batches each worker keeps in flight")
	fs.StringVar(&f.ordering, "ordering", string(outbox.OrderingKey), "key: messages of one key in commit order (partition leases); none: no order, SKIP LOCKED claims")
	fs.StringVar(&f.orderScope, "order-scope", string(outbox.OrderScopeTopic), "with --ordering key, what stays in order: topic (a key's messages per topic: a blocked topic or a failing message holds back only that topic's messages of the key) or key (a key's messages across every topic, for consumers reading several topics as one log)")
	fs.DurationVar(&f.publishTimeout, "publish-timeout", outbox.PublishTimeoutDefault, "bound of one publish batch")
	fs.DurationVar(&f.leaseTTL, "lease-ttl", outbox.LeaseTTLDefault, "partition lease lifetime; must exceed 2 × --publish-timeout (default: the larger of 30s and 3 × --publish-timeout)")
	fs.IntVar(&f.maxAttempts, "max-attempts", outbox.MaxAttemptsDefault, "failed attempts before a message is dead-lettered (a blocked destination spends none)")
	fs.StringVar(&f.onPermanent, "on-permanent", string(outbox.PermanentDeadLetter), "a message the broker can never take (too large, invalid): dead-letter (and go on with its key) or hold (keep it at the head of its key, retried at the longest backoff, logged as an error)")
	fs.DurationVar(&f.shutdownTimeout, "shutdown-timeout", outbox.ShutdownTimeoutDefault, "on SIGINT/SIGTERM, wait this long for the batches in hand")
	fs.DurationVar(&f.pollInterval, "poll-interval", outbox.PollIntervalDefault, "look for new messages this often when no notification arrives (four times less often while subscribed to the store's notifications, which announce every write)")
	fs.StringVar(&f.node, "node", "", "this relay's name in leases and status (default: hostname-pid-random)")
	fs.StringVar(&f.httpAddr, "http-addr", HTTPAddrDefault, "serve /healthz, /readyz and /metrics here (host:port; port 0 picks one; empty disables)")
	f.observe.add(fs)
	f.console.add(fs, "console-")
	f.otel.add(fs)
	f.cloudEvents.add(fs)
	fs.StringSliceVar(&f.createDestinations.Topics, "create-destinations", nil, "at start, create what the relay publishes these topics to, as `outbox destinations create --topic` does (a NATS stream, Kafka topics, a RabbitMQ exchange, queue and bindings), with the --stream…, --kafka-… and --queue… settings; what exists is left as it is (default: create nothing)")
	addDestinationSpecFlags(fs, &f.createDestinations)

	cmd.RunE = a.run(func(ctx context.Context, cmd *cobra.Command, _ []string) error {
		return a.runRelay(ctx, cmd, &f)
	})
	return cmd
}

// relayConfig turns the flags into an outbox.Config. A flag left at its
// default leaves the field zero, so that the library derives it (LeaseTTL
// from PublishTimeout, for one).
func (a *app) relayConfig(cmd *cobra.Command, f *relayFlags) (outbox.Config, error) {
	changed := func(name string) bool { return cmd.Flags().Changed(name) }
	var cfg outbox.Config
	ord, err := outbox.ParseOrdering(f.ordering)
	if err != nil {
		return cfg, usagef("%s must be %q or %q, got %q", a.flagRef("ordering"), outbox.OrderingKey, outbox.OrderingNone, f.ordering)
	}
	cfg.Ordering = ord
	if cfg.OrderScope, err = outbox.ParseOrderScope(f.orderScope); err != nil {
		return cfg, usagef("%s must be %q or %q, got %q", a.flagRef("order-scope"), outbox.OrderScopeTopic, outbox.OrderScopeKey, f.orderScope)
	}
	if cfg.OnPermanent, err = outbox.ParsePermanentPolicy(f.onPermanent); err != nil {
		return cfg, usagef("%s must be %q or %q, got %q", a.flagRef("on-permanent"), outbox.PermanentDeadLetter, outbox.PermanentHoldKey, f.onPermanent)
	}
	if err := a.between("workers", f.workers, 1, outbox.WorkersMax); err != nil {
		return cfg, err
	}
	if err := a.between("batch", f.batch, 1, outbox.BatchSizeMax); err != nil {
		return cfg, err
	}
	if err := a.between("max-attempts", f.maxAttempts, 1, outbox.MaxAttemptsMax); err != nil {
		return cfg, err
	}
	if err := a.between("in-flight", f.inFlight, 1, outbox.InFlightMax); err != nil {
		return cfg, err
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{
		{"publish-timeout", f.publishTimeout}, {"lease-ttl", f.leaseTTL},
		{"shutdown-timeout", f.shutdownTimeout}, {"poll-interval", f.pollInterval},
	} {
		if err := a.positiveDuration(d.name, d.v); err != nil {
			return cfg, err
		}
	}
	cfg.Workers = f.workers
	cfg.BatchSize = f.batch
	cfg.InFlight = f.inFlight
	cfg.MaxAttempts = f.maxAttempts
	cfg.ShutdownTimeout = f.shutdownTimeout
	cfg.PollInterval = f.pollInterval
	cfg.Node = f.node
	if changed("publish-timeout") {
		cfg.PublishTimeout = f.publishTimeout
	}
	if changed("lease-ttl") {
		cfg.LeaseTTL = f.leaseTTL
	}
	cfg.Logger = a.log
	if err := cfg.WithDefaults().Validate(); err != nil {
		return cfg, a.configError(err)
	}
	return cfg, nil
}

// configFieldFlags maps outbox.Config fields to the flags that set them.
var configFieldFlags = map[string]string{
	"Ordering":          "ordering",
	"OrderScope":        "order-scope",
	"Workers":           "workers",
	"BatchSize":         "batch",
	"FetchSize":         "batch",
	"InFlight":          "in-flight",
	"PublishTimeout":    "publish-timeout",
	"LeaseTTL":          "lease-ttl",
	"HeartbeatInterval": "lease-ttl",
	"PollInterval":      "poll-interval",
	"MaxAttempts":       "max-attempts",
	"OnPermanent":       "on-permanent",
	"ShutdownTimeout":   "shutdown-timeout",
}

var configFieldRe = regexp.MustCompile(`Config\.([A-Za-z]+)`)

// configError turns an outbox.Config validation error into a usage error
// naming the flag to change.
func (a *app) configError(err error) error {
	msg := strings.TrimPrefix(err.Error(), "outbox: ")
	if m := configFieldRe.FindStringSubmatch(msg); m != nil {
		if flag, ok := configFieldFlags[m[1]]; ok {
			return usagef("%s: %s", a.flagRef(flag), msg)
		}
	}
	return usagef("%s", msg)
}

func (a *app) runRelay(ctx context.Context, cmd *cobra.Command, f *relayFlags) (err error) {
	// Check everything that can be checked before opening connections.
	cfg, err := a.relayConfig(cmd, f)
	if err != nil {
		return err
	}
	if err := a.checkHTTPAddr(f.httpAddr); err != nil {
		return err
	}
	if err := f.observe.check(a); err != nil {
		return err
	}
	consoleAuth, err := a.checkConsole(&f.console, f.httpAddr)
	if err != nil {
		return err
	}
	if f.broker == "" {
		return usagef("--broker is required: give the broker URL, such as %s, or set %s", brokerExample, envName("broker"))
	}
	if f.maxInFlight < 0 {
		return usagef("%s must not be negative, got %d", a.flagRef("max-in-flight"), f.maxInFlight)
	}
	if f.ackTimeout < 0 {
		return usagef("%s must not be negative, got %v", a.flagRef("ack-timeout"), f.ackTimeout)
	}
	brokerOpts := backends.BrokerOptions{
		MaxInFlight:   f.maxInFlight,
		AckTimeout:    f.ackTimeout,
		SubjectPrefix: f.subjectPrefix,
		Logger:        a.log,
	}
	if err := f.security.apply(a, &brokerOpts); err != nil {
		return err
	}
	if brokerOpts.CloudEvents, err = f.cloudEvents.options(a); err != nil {
		return err
	}
	if err := f.store.check(a); err != nil {
		return err
	}
	if err := backends.CheckBrokerURL(f.broker, brokerOpts); err != nil {
		return err
	}
	tracing, err := f.otel.resolve(a)
	if err != nil {
		return err
	}

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}), newBuildInfoGauge())

	openCtx, cancelOpen := context.WithTimeout(ctx, time.Minute)
	defer cancelOpen()
	store, err := f.store.open(openCtx, a)
	if err != nil {
		return err
	}
	defer a.closeStore(store)
	obs, err := a.newObservability(reg, store, &f.observe)
	if err != nil {
		return err
	}
	cfg.Hook = obs.hook()
	if rc, ok := store.(outbox.RequestCounter); ok {
		if err := outboxprom.RegisterRequests(reg, rc); err != nil {
			return err
		}
	}
	if sr, ok := store.(outbox.SlotReader); ok {
		if err := outboxprom.RegisterSlot(reg, sr); err != nil {
			return err
		}
	}
	if hr, ok := store.(outbox.HorizonReader); ok {
		if err := outboxprom.RegisterHorizon(reg, hr); err != nil {
			return err
		}
	}
	if c, ok := store.(interface{ Check(context.Context) error }); ok {
		// Capture wal: a setting to change or a lost slot stops the relay
		// here, with what to do, rather than in every lease round.
		if err := c.Check(openCtx); err != nil {
			return err
		}
	}
	if len(f.createDestinations.Topics) > 0 {
		if err := a.createRelayDestinations(openCtx, f.broker, brokerOpts, f.createDestinations); err != nil {
			return err
		}
	}
	pub, err := backends.OpenPublisher(openCtx, f.broker, brokerOpts)
	if err != nil {
		return err
	}
	defer func() {
		if cerr := pub.Close(); cerr != nil {
			a.log.Warn("close broker", "err", cerr)
		}
	}()

	if tracing.enabled {
		tracer, shutdown, err := a.startTracing(ctx, tracing, messagingSystem(f.broker))
		if err != nil {
			return err
		}
		defer shutdown() // after the relay stopped: flushes its last spans
		cfg.Tracer = tracer
	} else {
		a.log.Debug("tracing: off", "reason", tracing.why)
	}

	relay, err := outbox.NewRelay(store, pub, cfg)
	if err != nil {
		if errors.Is(err, outbox.ErrUnsupported) {
			return usagef("%s: %v", a.flagRef("ordering"), err)
		}
		return a.configError(err)
	}
	cfg = relay.Config()
	if err := obs.watchRelay(relay, pub, &f.observe); err != nil {
		return err
	}
	if err := obs.start(ctx); err != nil {
		return err
	}
	defer obs.stop()

	consoleHandler, closeConsole, err := a.relayConsole(&f.console, consoleAuth, f.store.url, store, relay)
	if err != nil {
		return err
	}
	defer closeConsole()
	srv, err := a.serveHTTP(f.httpAddr, obs, consoleHandler)
	if err != nil {
		return err
	}
	defer func() {
		if serr := srv.shutdown(httpShutdownTimeout); serr != nil {
			a.log.Warn("http shutdown", "err", serr)
		}
	}()

	// The relay must not die with ctx: a signal asks for a graceful Stop.
	if err := relay.Start(context.WithoutCancel(ctx)); err != nil {
		return fmt.Errorf("start relay: %w", err)
	}
	a.log.Info("relay started", "node", cfg.Node, "ordering", cfg.Ordering, "order_scope", cfg.OrderScope, "workers", cfg.Workers,
		"batch", cfg.BatchSize, "publish_timeout", cfg.PublishTimeout, "lease_ttl", cfg.LeaseTTL,
		"max_attempts", cfg.MaxAttempts)

	stoppedByItself := false
	select {
	case <-ctx.Done():
		a.log.Info("stopping relay", "reason", context.Cause(ctx), "shutdown_timeout", cfg.ShutdownTimeout)
	case <-relay.Done():
		stoppedByItself = true
	}
	stopErr := relay.Stop()
	st := relay.Stats()
	a.log.Info("relay stopped", "published", st.Published, "failed", st.Failed, "dead_lettered", st.DeadLettered, "fenced", st.Fenced)
	if stopErr != nil {
		return fmt.Errorf("relay: %w", stopErr)
	}
	if stoppedByItself {
		return errors.New("relay stopped unexpectedly")
	}
	return nil
}
