package natsjs

import (
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/outboxrelay/outbox"
	"github.com/outboxrelay/outbox/cloudevents"

	"github.com/outboxrelay/outbox/broker/internal/optcheck"
	"github.com/outboxrelay/outbox/broker/internal/pubgate"
	"github.com/outboxrelay/outbox/internal/redact"
)

// Defaults and limits of [Options].
const (
	// MaxInFlightDefault bounds the messages a Publisher waits for at once.
	MaxInFlightDefault = 4096
	// MaxInFlightMax is the largest MaxInFlight accepted.
	MaxInFlightMax = 1 << 20

	// AckTimeoutDefault is how long a Publish waits for acknowledgements
	// when its context has no deadline.
	AckTimeoutDefault = 10 * time.Second
	// AckTimeoutMin is the smallest AckTimeout accepted.
	AckTimeoutMin = time.Millisecond

	// stallWaitMax bounds how long one message waits for room in the
	// JetStream context's own async-publish window (see Publish).
	stallWaitMax = time.Second
)

// Options configures a [Publisher]. The zero value is valid: every field has
// a default.
type Options struct {
	// MaxInFlight bounds the messages published but not yet acknowledged
	// that the Publisher waits for, shared by all concurrent Publish calls
	// (default MaxInFlightDefault, at most MaxInFlightMax). A Publisher made
	// by Dial also sets it as the JetStream context's
	// jetstream.WithPublishAsyncMaxPending.
	MaxInFlight int
	// AckTimeout is how long a Publish call waits for the acknowledgements
	// of its batch when its context has no deadline (default
	// AckTimeoutDefault). A Publisher made by Dial also sets it as the
	// JetStream context's jetstream.WithPublishAsyncTimeout, so that no
	// acknowledgement is awaited for longer than that.
	AckTimeout time.Duration
	// SubjectPrefix is prepended to each message's Topic to make its NATS
	// subject (default none). It is made of tokens of [A-Za-z0-9_-]
	// separated by dots, usually ending with a dot: "outbox." publishes
	// topic "orders.created" to subject "outbox.orders.created".
	SubjectPrefix string
	// Logger receives the connection events of a Publisher made by Dial
	// (disconnections, reconnections, asynchronous errors). Default: discard.
	Logger *slog.Logger
	// CloudEvents, if set, publishes every message as a CloudEvent in
	// binary or structured content mode (see package cloudevents for the
	// attributes and the NATS ("ce-" headers, percent-encoded) binding's header names). Default: off.
	CloudEvents *cloudevents.Options
}

// WithDefaults returns o with the zero fields set to their defaults.
func (o Options) WithDefaults() Options {
	o.MaxInFlight = cmp.Or(o.MaxInFlight, MaxInFlightDefault)
	o.AckTimeout = cmp.Or(o.AckTimeout, AckTimeoutDefault)
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	return o
}

// validate checks o after WithDefaults, naming the field in its errors.
func (o Options) validate() error {
	c := optcheck.Check("natsjs")
	c.Between("MaxInFlight", o.MaxInFlight, 1, MaxInFlightMax)
	c.AtLeast("AckTimeout", o.AckTimeout, AckTimeoutMin)
	if p := o.SubjectPrefix; p != "" {
		if err := outbox.ValidateTopic(strings.TrimSuffix(p, ".")); err != nil {
			c.Failf(true, "SubjectPrefix must be tokens of letters, digits, '_' and '-' separated by dots, optionally ending with a dot (like \"outbox.\"), got %q: %w", p, err)
		}
	}
	return c.Err()
}

// Publisher publishes outbox messages to NATS JetStream. It implements
// [outbox.Publisher]: it sends each batch fully pipelined with
// asynchronous publishes, waits for every acknowledgement, and returns one
// result per message. It never retries; it classifies each failure as
// [outbox.Permanent] (the message can never be stored), [outbox.Blocked]
// (the destination or the server is unusable, or the outcome is unknown)
// or retryable (see Publish).
//
// Each message goes to subject SubjectPrefix+Topic with these headers, plus
// the message's own:
//
//   - Nats-Msg-Id and Outbox-Id: Message.ID. JetStream drops a message whose
//     ID it has stored within the stream's Duplicates window (two minutes by
//     default) and acknowledges it as a duplicate, which Publish reports
//     with an error wrapping [outbox.ErrDuplicate] (the relay counts it as
//     delivered, and logs it), so a message re-published after a lost
//     acknowledgement is stored once, and a new message that reuses an ID
//     does not vanish unnoticed.
//   - Outbox-Key: Message.Key, when not empty.
//   - Outbox-Created-At: Message.CreatedAt, RFC 3339 with nanoseconds, UTC.
//
// A Publisher is safe for concurrent use.
type Publisher struct {
	js     jetstream.JetStream
	nc     *nats.Conn // owned connection (Dial), or nil (New)
	opts   Options
	sem    chan struct{} // one token per message awaited, shared by all calls
	denied *denials      // permission violations the server reported (Dial)
	gate   *pubgate.Gate
	ce     *cloudevents.Encoder // nil: CloudEvents off
}

// New returns a Publisher that publishes through js. The caller owns js's
// connection and closes it after Close. js's own async-publish settings
// apply as well: give it a PublishAsyncMaxPending of at least MaxInFlight
// (or none) and a PublishAsyncTimeout, so that acknowledgements abandoned by
// cancelled calls are forgotten.
func New(js jetstream.JetStream, opts Options) (*Publisher, error) {
	if js == nil {
		return nil, errors.New("natsjs: New needs a jetstream.JetStream, got nil")
	}
	opts = opts.WithDefaults()
	if err := opts.validate(); err != nil {
		return nil, err
	}
	ce, err := cloudevents.New(opts.CloudEvents, cloudevents.NATS)
	if err != nil {
		return nil, fmt.Errorf("natsjs: Options.CloudEvents: %w", err)
	}
	gate := pubgate.New(pubgate.Config{Name: "natsjs", Timeout: opts.AckTimeout, TimeoutField: "AckTimeout", Awaited: "acknowledgement"})
	return &Publisher{js: js, opts: opts, sem: make(chan struct{}, opts.MaxInFlight), denied: &denials{}, gate: gate, ce: ce}, nil
}

// Dial connects to the NATS server(s) at url (comma-separated URLs for a
// cluster) and returns a Publisher that owns the connection; Close drains
// and closes it. By default the connection reconnects forever, keeps no
// reconnect buffer (nats.ReconnectBufSize(-1): a publish made while
// disconnected fails at once, for certain, instead of being sent after
// the reconnection while its acknowledgement is reported lost), and reports
// its events to opts.Logger instead of standard error; natsOpts are applied
// after those defaults and may override them. If no server can be reached,
// the error names url (with any password redacted).
func Dial(url string, opts Options, natsOpts ...nats.Option) (*Publisher, error) {
	opts = opts.WithDefaults()
	if err := opts.validate(); err != nil {
		return nil, err
	}
	log := opts.Logger.With("url", redact.URL(url))
	denied := &denials{}
	all := append([]nats.Option{
		nats.Name("outbox-relay"),
		nats.MaxReconnects(-1),
		nats.ReconnectBufSize(-1),
		nats.ErrorHandler(func(_ *nats.Conn, sub *nats.Subscription, err error) {
			denied.note(err)
			if sub != nil {
				log.Warn("natsjs: asynchronous error", "subject", sub.Subject, "err", err)
				return
			}
			log.Warn("natsjs: asynchronous error", "err", err)
		}),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			if err != nil { // nil on an orderly Close
				log.Warn("natsjs: disconnected", "err", err)
			}
		}),
		nats.ReconnectHandler(func(nc *nats.Conn) {
			log.Info("natsjs: reconnected", "server", redact.URL(nc.ConnectedUrl()))
		}),
	}, natsOpts...)
	nc, err := nats.Connect(url, all...)
	if err != nil {
		hint := " (is a NATS server with JetStream running there?)"
		var tlsErr *tls.CertificateVerificationError
		var alert tls.AlertError
		if errors.Is(err, nats.ErrAuthorization) || errors.Is(err, nats.ErrAuthExpired) || errors.Is(err, nats.ErrAuthRevoked) ||
			errors.Is(err, nats.ErrSecureConnRequired) || errors.Is(err, nats.ErrSecureConnWanted) ||
			errors.As(err, &tlsErr) || errors.As(err, &alert) || strings.Contains(err.Error(), "tls error") {
			hint = "" // a server answered: it refused the credentials or TLS settings
		}
		return nil, fmt.Errorf("natsjs: connect to %s: %w%s", redact.URL(url), err, hint)
	}
	js, err := jetstream.New(nc,
		jetstream.WithPublishAsyncMaxPending(opts.MaxInFlight),
		jetstream.WithPublishAsyncTimeout(opts.AckTimeout),
	)
	if err != nil {
		nc.Close()
		return nil, fmt.Errorf("natsjs: %s: %w", redact.URL(url), err)
	}
	p, err := New(js, opts)
	if err != nil {
		nc.Close()
		return nil, err
	}
	p.nc = nc
	p.denied = denied
	return p, nil
}

// Subject returns the NATS subject of topic: SubjectPrefix+topic.
func (p *Publisher) Subject(topic string) string { return p.opts.SubjectPrefix + topic }

// Close makes later Publish calls fail with [outbox.ErrClosed], waits for
// the calls in progress to return (at most their deadline, or AckTimeout),
// and, for a Publisher made by Dial, drains and closes the connection.
// Calling Close again returns nil.
func (p *Publisher) Close() error {
	if !p.gate.Close() || p.nc == nil || p.nc.IsClosed() {
		return nil
	}
	closed := p.nc.StatusChanged(nats.CLOSED)
	defer p.nc.RemoveStatusListener(closed)
	if err := p.nc.Drain(); err != nil {
		// Reconnecting (or closed meanwhile): there is nothing to drain.
		p.nc.Close()
		if errors.Is(err, nats.ErrConnectionReconnecting) || errors.Is(err, nats.ErrConnectionClosed) {
			return nil
		}
		return fmt.Errorf("natsjs: drain connection: %w", err)
	}
	timer := time.NewTimer(p.nc.Opts.DrainTimeout + time.Second)
	defer timer.Stop()
	select {
	case <-closed:
	case <-timer.C:
		p.nc.Close()
		return fmt.Errorf("natsjs: connection not drained within %v; closed it", p.nc.Opts.DrainTimeout)
	}
	return nil
}

// sent is a message published and awaiting its acknowledgement.
type sent struct {
	index int
	paf   jetstream.PubAckFuture
}

// Publish implements [outbox.Publisher]. It publishes msgs asynchronously,
// in order, never having more than MaxInFlight messages unacknowledged
// across all calls, then waits for every acknowledgement until ctx ends (or
// AckTimeout passes, if ctx has no deadline). It returns one result per
// message: nil when JetStream stored the message, an error wrapping
// [outbox.ErrDuplicate] when JetStream acknowledged it as a duplicate of a
// message with the same ID stored within the stream's Duplicates window.
// When ctx ends first, Publish returns at once, with an error for every
// message not yet acknowledged; those may still be stored. Errors are
// classified:
//
//   - the message itself can never be stored: it exceeds the server's
//     max_payload or the stream's max_msg_size, its headers exceed
//     JetStream's 64 KiB, its key or a header value would reach NATS
//     altered (CR, LF, leading or trailing spaces: Message.Validate refuses
//     them at Write), the subject is invalid: [outbox.Permanent];
//   - the destination or the server is unusable, or the outcome is
//     unknown: no stream covers the subject (or its stream did not answer),
//     JetStream is not enabled, the stream is full with DiscardNew or
//     sealed, the account or server is out of resources, the server refused
//     the publish for lack of permission, the connection is down (a publish
//     while disconnected fails at once with a Publisher made by Dial), the
//     acknowledgement did not come in time or was lost with the connection:
//     [outbox.Blocked] with the message's topic as destination;
//   - anything else, and a cancelled ctx: retryable.
//
// Publish may be called concurrently. It does not retain msgs.
func (p *Publisher) Publish(ctx context.Context, msgs []*outbox.Message) []error {
	return p.gate.Do(ctx, len(msgs), func(ctx context.Context, errs []error) {
		if p.publishInline(ctx, msgs, errs) {
			p.resolveNoStream(ctx, errs)
			return
		}
		pending := make(chan sent, len(msgs))
		var wg sync.WaitGroup
		wg.Go(func() { p.await(ctx, msgs, pending, errs) })
		p.send(ctx, msgs, pending, errs)
		wg.Wait()
		p.resolveNoStream(ctx, errs)
	})
}

// inlineMax is the largest call publishInline takes: a steady load's
// calls are a transaction's share, a few messages each.
const inlineMax = 64

// publishInline publishes a small call in the caller's goroutine: when the
// tokens of all its messages can be taken at once, without waiting, it
// sends them all, then awaits them, so the call costs no goroutine, no
// channel of futures and no hand-off per acknowledgement. It never waits
// for a token while holding others (calls that do could take every token
// between them and wait for each other until their deadlines). It reports
// false, having taken nothing, when the call is larger than inlineMax or
// the tokens are not free: Publish then sends and awaits side by side.
func (p *Publisher) publishInline(ctx context.Context, msgs []*outbox.Message, errs []error) bool {
	if len(msgs) > inlineMax {
		return false
	}
	for i := range msgs {
		select {
		case p.sem <- struct{}{}:
		default:
			for range i {
				<-p.sem
			}
			return false
		}
	}
	var futures [inlineMax]jetstream.PubAckFuture
	for i, m := range msgs {
		subject := p.Subject(m.Topic)
		if err := unaltered(m); err != nil {
			<-p.sem
			errs[i] = outbox.Permanent(fmt.Errorf("natsjs: publish to %q: message %s: %w", subject, m.ID, err))
			continue
		}
		if ctx.Err() != nil {
			for range msgs[i:] {
				<-p.sem
			}
			p.failRest(ctx, msgs[i:], errs[i:])
			break
		}
		paf, err := p.publishAsync(ctx, subject, m)
		if err != nil {
			<-p.sem
			errs[i] = p.classify(subject, m, err)
			continue
		}
		futures[i] = paf
	}
	for i, paf := range futures[:len(msgs)] {
		if paf != nil {
			errs[i] = p.result(ctx, msgs[i], paf)
			<-p.sem
		}
	}
	return true
}

// publishAsync sends m to subject without waiting for its acknowledgement
// (a stall on nats.go's own pending limit waits at most until ctx's
// deadline).
func (p *Publisher) publishAsync(ctx context.Context, subject string, m *outbox.Message) (jetstream.PubAckFuture, error) {
	stall := stallWaitMax
	if deadline, ok := ctx.Deadline(); ok {
		stall = max(min(stall, time.Until(deadline)), time.Millisecond)
	}
	return p.js.PublishMsgAsync(p.natsMsg(subject, m),
		jetstream.WithRetryAttempts(0), // the relay retries, with backoff
		jetstream.WithStallWait(stall),
	)
}

// send publishes msgs in order, each after taking a token of p.sem, and
// passes the futures to await through pending, which it closes. It sets the
// errors of the messages it could not send.
func (p *Publisher) send(ctx context.Context, msgs []*outbox.Message, pending chan<- sent, errs []error) {
	defer close(pending)
	for i, m := range msgs {
		subject := p.Subject(m.Topic)
		if err := unaltered(m); err != nil {
			errs[i] = outbox.Permanent(fmt.Errorf("natsjs: publish to %q: message %s: %w", subject, m.ID, err))
			continue
		}
		if ctx.Err() != nil {
			p.failRest(ctx, msgs[i:], errs[i:])
			return
		}
		select {
		case p.sem <- struct{}{}:
		case <-ctx.Done():
			p.failRest(ctx, msgs[i:], errs[i:])
			return
		}
		paf, err := p.publishAsync(ctx, subject, m)
		if err != nil {
			<-p.sem
			errs[i] = p.classify(subject, m, err)
			continue
		}
		pending <- sent{i, paf}
	}
}

// failRest sets the errors of messages not sent because ctx ended.
func (p *Publisher) failRest(ctx context.Context, msgs []*outbox.Message, errs []error) {
	for i, m := range msgs {
		errs[i] = p.ended(ctx, m, "not sent")
	}
}

// ended is the error of a message whose call ended (ctx) before its
// acknowledgement: blocked if the deadline passed (the server is slow or
// unreachable, for this destination at least), retryable if the call was
// cancelled.
func (p *Publisher) ended(ctx context.Context, m *outbox.Message, what string) error {
	subject := p.Subject(m.Topic)
	err := fmt.Errorf("natsjs: publish to %q: %s: %w", subject, what, context.Cause(ctx))
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return outbox.Blocked(m.Topic, p.denied.explain(subject, err))
	}
	return err
}

// await waits for the futures from pending, in order, sets their results
// and gives back their tokens. Once ctx has ended it only collects the
// results already there.
func (p *Publisher) await(ctx context.Context, msgs []*outbox.Message, pending <-chan sent, errs []error) {
	for s := range pending {
		err := p.result(ctx, msgs[s.index], s.paf)
		<-p.sem
		errs[s.index] = err
	}
}

// result waits for the acknowledgement of m, sent with paf, and returns
// its result (see Publish); once ctx has ended it only takes a result
// already there.
func (p *Publisher) result(ctx context.Context, m *outbox.Message, paf jetstream.PubAckFuture) error {
	subject := p.Subject(m.Topic)
	select {
	case ack := <-paf.Ok():
		return p.acked(subject, m, ack)
	case e := <-paf.Err():
		return p.classify(subject, m, e)
	case <-ctx.Done():
		// An acknowledgement that arrived meanwhile still counts.
		select {
		case ack := <-paf.Ok():
			return p.acked(subject, m, ack)
		case e := <-paf.Err():
			return p.classify(subject, m, e)
		default:
			return p.ended(ctx, m, "not acknowledged (the message may be stored)")
		}
	}
}

// acked is the result of a message JetStream acknowledged: nil, or an error
// wrapping outbox.ErrDuplicate if JetStream had stored its ID already.
func (p *Publisher) acked(subject string, m *outbox.Message, ack *jetstream.PubAck) error {
	p.denied.clear(subject)
	if ack == nil || !ack.Duplicate {
		return nil
	}
	return fmt.Errorf("%w: natsjs: publish to %q: stream %s had stored message ID %s already (sequence %d), within its Duplicates window: a retry after a lost acknowledgement, or two messages sharing an ID",
		outbox.ErrDuplicate, subject, ack.Stream, m.ID, ack.Sequence)
}

// natsMsg builds the NATS message for m.
func (p *Publisher) natsMsg(subject string, m *outbox.Message) *nats.Msg {
	if p.ce != nil {
		m, _ = p.ce.Encode(m)
	}
	h := make(nats.Header, len(m.Headers)+4)
	for k, v := range m.Headers {
		h[k] = []string{v}
	}
	// Ours last: a reserved name in m.Headers (rejected by Validate) cannot
	// override them.
	h[jetstream.MsgIDHeader] = []string{m.ID}
	h[outbox.HeaderID] = []string{m.ID}
	if m.Key != "" {
		h[outbox.HeaderKey] = []string{m.Key}
	}
	if !m.CreatedAt.IsZero() {
		h[outbox.HeaderCreatedAt] = []string{m.CreatedAt.UTC().Format(time.RFC3339Nano)}
	}
	return &nats.Msg{Subject: subject, Data: m.Payload, Header: h}
}
