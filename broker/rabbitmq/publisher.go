package rabbitmq

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outboxrelay/outbox"
	"github.com/outboxrelay/outbox/cloudevents"

	"github.com/outboxrelay/outbox/broker/internal/pubgate"
	"github.com/outboxrelay/outbox/internal/redact"
)

// stuckWriteGrace is how long a Publish call whose context has ended waits
// for a write to the socket to return before it kills the connection (a
// broker that blocked publishers stops reading, so a write can block
// forever).
const stuckWriteGrace = 2 * time.Second

// closeTimeout bounds the AMQP closing handshake in Close.
const closeTimeout = 5 * time.Second

// Publisher publishes outbox messages to a RabbitMQ exchange with publisher
// confirms. It implements [outbox.Publisher]: each batch is published
// pipelined on one channel, and Publish returns one result per message once
// the broker has confirmed (or refused) each. It never retries; it
// classifies each failure as [outbox.Permanent] (the message can never be
// published), [outbox.Blocked] (the destination or the broker is unusable,
// or the outcome unknown) or retryable (see Publish).
//
// Each message is published to Options.Exchange with routing key
// Options.RoutingKey(Topic), the mandatory flag (unless AllowUnroutable),
// and these properties:
//
//   - message-id: Message.ID;
//   - type: Message.Topic;
//   - timestamp: Message.CreatedAt (seconds);
//   - delivery mode 2, persistent (1 if Transient);
//   - content type: the message's "Content-Type" header, else
//     application/octet-stream;
//   - headers: the message's own, plus Outbox-Id (Message.ID), Outbox-Key
//     (Message.Key, when not empty) and Outbox-Created-At (RFC 3339 with
//     nanoseconds, UTC).
//
// The Publisher owns one connection. When it is lost (a broker restart, a
// network failure), the messages awaiting a confirm fail with errors
// blocking their topics, and the next Publish call dials again; after a
// failed attempt, calls fail at once (blocked) until the backoff
// (ReconnectBackoff, doubling up to ReconnectBackoffMax) has passed.
//
// A Publisher is safe for concurrent use.
type Publisher struct {
	url      string // as given, with credentials
	redacted string // for errors and logs
	opts     Options
	ce       *cloudevents.Encoder // nil: CloudEvents off
	sem      chan struct{}        // one token per message awaiting its confirm
	rr       atomic.Uint64        // round robin over channels

	// lock guards the fields below; a channel so that waiting for it
	// honours the caller's context (a dial may hold it for DialTimeout).
	lock     chan struct{}
	sess     *session
	failures int       // consecutive failed dials
	nextDial time.Time // no dial before this, after a failure
	lastErr  error     // the last dial failure or connection loss

	gate *pubgate.Gate
	bg   sync.WaitGroup // goroutines: connection watchers, confirm collectors
}

// Dial connects to the broker at url (amqp://user:password@host:5672/vhost,
// or amqps:// for TLS), declares the exchange (or checks it, with
// PassiveExchange), and returns a Publisher that owns the connection. ctx
// and opts.DialTimeout bound the attempt. Errors name url, with its
// password redacted, and say what to change.
func Dial(ctx context.Context, url string, opts Options) (*Publisher, error) {
	opts = opts.WithDefaults()
	if err := opts.validate(); err != nil {
		return nil, err
	}
	ce, err := cloudevents.New(opts.CloudEvents, cloudevents.AMQP)
	if err != nil {
		return nil, fmt.Errorf("rabbitmq: Options.CloudEvents: %w", err)
	}
	redacted := redact.URL(url)
	uri, err := amqp.ParseURI(url)
	if err != nil {
		return nil, fmt.Errorf("rabbitmq: invalid URL %s: %w; want amqp://user:password@host:5672/vhost (or amqps://)", redacted, err)
	}
	if uri.Scheme == "amqps" && opts.TLS != nil && opts.TLS.ServerName == "" {
		tlsCfg := opts.TLS.Clone()
		tlsCfg.ServerName = uri.Host
		opts.TLS = tlsCfg
	}
	p := &Publisher{
		url:      url,
		redacted: redacted,
		opts:     opts,
		ce:       ce,
		sem:      make(chan struct{}, opts.MaxInFlight),
		lock:     make(chan struct{}, 1),
		gate:     pubgate.New(pubgate.Config{Name: "rabbitmq", Timeout: opts.PublishTimeout, TimeoutField: "PublishTimeout", Awaited: "confirm"}),
	}
	s, err := dialSession(ctx, url, &p.opts, &p.bg)
	if err != nil {
		p.bg.Wait()
		return nil, dialError(redacted, err)
	}
	p.sess = s
	return p, nil
}

// dialError explains a failed connection attempt.
func dialError(redacted string, err error) error {
	var ae *amqp.Error
	switch {
	case strings.HasPrefix(err.Error(), "rabbitmq: "): // ours: declaring the exchange
		return fmt.Errorf("%w (broker %s)", err, redacted)
	case errors.Is(err, amqp.ErrSASL), errors.As(err, &ae) && ae.Code == amqp.AccessRefused:
		return fmt.Errorf("rabbitmq: %s refused the credentials: check the user and password in the URL: %w", redacted, err)
	case errors.Is(err, amqp.ErrVhost), errors.As(err, &ae) && ae.Code == amqp.NotAllowed:
		return fmt.Errorf("rabbitmq: %s: the virtual host (the URL's path, %%2F for \"/\") does not exist or the user may not use it: %w", redacted, err)
	case errors.As(err, &ae):
		return fmt.Errorf("rabbitmq: %s: %w", redacted, err)
	}
	var ne interface{ Timeout() bool }
	if errors.As(err, &ne) && ne.Timeout() {
		return fmt.Errorf("rabbitmq: cannot connect to %s in time: %w; check the URL's host and port and that RabbitMQ runs there (raise DialTimeout for a slow network)", redacted, err)
	}
	return fmt.Errorf("rabbitmq: cannot connect to %s: %w; check the URL's host and port and that RabbitMQ runs there", redacted, err)
}

// Close makes later Publish calls fail with [outbox.ErrClosed], waits for
// the calls in progress to return (at most their deadline, or
// PublishTimeout), and closes the connection. Calling Close again returns
// nil.
func (p *Publisher) Close() error {
	if !p.gate.Close() {
		return nil
	}
	p.lock <- struct{}{}
	s := p.sess
	p.sess = nil
	<-p.lock
	if s != nil && !s.gone() {
		s.close(closeTimeout)
	}
	// The watchers end with the connection; the confirm collectors once
	// their confirms are settled, which closing the connection forces.
	p.bg.Wait()
	return nil
}

// channel returns the session and the channel for the next Publish call,
// dialing or opening a channel if needed.
func (p *Publisher) channel(ctx context.Context) (*session, *channel, error) {
	if err := p.acquire(ctx); err != nil {
		return nil, nil, err
	}
	defer func() { <-p.lock }()

	s, err := p.connect(ctx)
	if err != nil {
		return nil, nil, err
	}
	i := int(p.rr.Add(1) % uint64(len(s.chans)))
	c := s.chans[i]
	if c == nil || c.closed() {
		if c != nil {
			p.opts.Logger.Warn("rabbitmq: channel closed by the broker; opening another", "url", p.redacted, "err", c.closeErr())
		}
		var err error
		c, err = s.openChannel(&p.opts, p.opts.MaxInFlight+1)
		if err != nil {
			return nil, nil, fmt.Errorf("%w (broker %s)", err, p.redacted)
		}
		s.chans[i] = c
	}
	return s, c, nil
}

// acquire takes p.lock, unless ctx ends first.
func (p *Publisher) acquire(ctx context.Context) error {
	select {
	case p.lock <- struct{}{}:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("rabbitmq: waiting for the connection to %s: %w", p.redacted, context.Cause(ctx))
	}
}

// connect returns the live session, dialing a new one (no sooner than the
// reconnect backoff allows) when the connection is gone. The caller holds
// p.lock.
func (p *Publisher) connect(ctx context.Context) (*session, error) {
	s := p.sess
	if s != nil && s.gone() {
		<-s.done
		p.lastErr = s.err
		p.opts.Logger.Warn("rabbitmq: connection lost", "url", p.redacted, "err", s.err)
		p.sess, s = nil, nil
	}
	if s != nil {
		return s, nil
	}
	if wait := time.Until(p.nextDial); wait > 0 {
		return nil, fmt.Errorf("rabbitmq: not connected to %s (next attempt in %v): %w", p.redacted, wait.Round(time.Millisecond), p.lastErr)
	}
	s, err := dialSession(ctx, p.url, &p.opts, &p.bg)
	if err != nil {
		p.failures++
		p.nextDial = time.Now().Add(outbox.Backoff(p.failures, p.opts.ReconnectBackoff, p.opts.ReconnectBackoffMax))
		p.lastErr = err
		p.opts.Logger.Warn("rabbitmq: reconnect failed", "url", p.redacted, "attempt", p.failures, "err", err)
		return nil, dialError(p.redacted, err)
	}
	if p.failures > 0 || p.lastErr != nil {
		p.opts.Logger.Info("rabbitmq: reconnected", "url", p.redacted, "attempts", p.failures+1)
	}
	p.failures, p.lastErr = 0, nil
	p.sess = s
	return s, nil
}

// Publish implements [outbox.Publisher]. It publishes msgs in order on one
// channel, pipelined, never having more than MaxInFlight messages
// unconfirmed across all calls, then waits for every confirm until ctx ends
// (or PublishTimeout passes, if ctx has no deadline). It returns one result
// per message: nil when the broker confirmed the message and did not return
// it as unroutable. When ctx ends first, Publish returns promptly with an
// error for every message not yet confirmed; those may still be delivered.
// Errors are classified:
//
//   - the message itself can never be published: a body over
//     MaxMessageSize, headers too large for an AMQP frame, a routing key out
//     of range: [outbox.Permanent];
//   - the destination or the broker is unusable, or the outcome unknown:
//     unroutable (returned by the broker, NO_ROUTE 312: no queue bound for
//     the routing key), a missing exchange (NOT_FOUND 404), an access
//     refusal (ACCESS_REFUSED 403), a negative confirm (a queue full with
//     overflow reject-publish, or an internal error), the connection or
//     channel lost before the confirm, no connection, publishers blocked by
//     a broker alarm, no confirm by ctx's deadline: [outbox.Blocked] with
//     the message's topic as destination;
//   - anything else (the broker closing the channel with
//     PRECONDITION_FAILED, a cancelled ctx): retryable.
//
// Publish may be called concurrently. It does not retain msgs.
func (p *Publisher) Publish(ctx context.Context, msgs []*outbox.Message) []error {
	return p.gate.Do(ctx, len(msgs), func(ctx context.Context, errs []error) {
		s, c, err := p.channel(ctx)
		if err != nil {
			for i, m := range msgs {
				errs[i] = p.blockedUnlessCancelled(ctx, m, err)
			}
			return
		}
		k := p.build(ctx, s, c, msgs, errs)
		if k.mandatory {
			c.register(k.batch)
			defer c.unregister(k.batch)
		}
		k.send()
		k.await()
	})
}

// call is one Publish call on a channel: its messages, their AMQP
// publishings, and how far sending and settling have come.
type call struct {
	p         *Publisher
	ctx       context.Context
	s         *session
	c         *channel
	msgs      []*outbox.Message
	errs      []error
	pubs      []amqp.Publishing // by message index
	batch     []*inflight       // the messages to send, in order
	mandatory bool
	sent      int // batch[:sent] were published (or failed to be)
	settled   int // batch[:settled] have their result
}

// build makes the publishings of msgs. The failures found here are the
// message's own and permanent; the other messages form the batch to send.
func (p *Publisher) build(ctx context.Context, s *session, c *channel, msgs []*outbox.Message, errs []error) *call {
	k := &call{p: p, ctx: ctx, s: s, c: c, msgs: msgs, errs: errs,
		pubs:      make([]amqp.Publishing, len(msgs)),
		batch:     make([]*inflight, 0, len(msgs)),
		mandatory: !p.opts.AllowUnroutable,
	}
	for i, m := range msgs {
		key := p.opts.RoutingKey(m.Topic)
		contentType := ""
		if p.ce != nil && m.ID != "" {
			m, contentType = p.ce.Encode(m)
		}
		if errs[i] = p.check(s, m, key); errs[i] != nil {
			continue
		}
		k.pubs[i] = p.publishing(m, contentType)
		k.batch = append(k.batch, &inflight{index: i, id: m.ID, routingKey: key})
	}
	return k
}

// send publishes the batch in order, pipelined, each message after taking
// a token of p.sem. It stops at the first failure that concerns the rest
// of the batch (ctx ended, publishers blocked, the channel lost) and sets
// their errors.
func (k *call) send() {
	defer k.watchdog()()
	p := k.p
	for k.sent < len(k.batch) {
		in := k.batch[k.sent]
		if !k.reserve() {
			k.failRest(fmt.Errorf("rabbitmq: publish: not sent: %w", context.Cause(k.ctx)))
			return
		}
		if reason := k.s.blocked.Load(); reason != nil {
			<-p.sem
			k.failRest(fmt.Errorf("rabbitmq: publish: not sent: the broker blocks publishers (%s); retry later", *reason))
			return
		}
		dc, err := k.c.ch.PublishWithDeferredConfirmWithContext(k.ctx, p.opts.Exchange, in.routingKey, k.mandatory, false, k.pubs[in.index])
		if err != nil {
			<-p.sem
			if k.c.closed() || errors.Is(err, amqp.ErrClosed) {
				lost := p.channelLost(k.c, "not sent")
				for _, in := range k.batch[k.sent:] {
					k.errs[in.index] = p.lostError(k.msgs[in.index], lost)
				}
				k.sent = len(k.batch)
				return
			}
			k.errs[in.index] = fmt.Errorf("rabbitmq: publish to exchange %q with routing key %q: not sent: %w", p.opts.Exchange, in.routingKey, err)
			k.sent++
			continue
		}
		in.dc = dc
		k.sent++
	}
}

// watchdog guards the sending: a write blocked on a socket the broker no
// longer reads must not hold the call past its context, so once ctx has
// ended and stuckWriteGrace passed, it kills the connection. Call the
// function it returns when the sending is over.
func (k *call) watchdog() (stop func()) {
	sending := make(chan struct{})
	stopWatchdog := context.AfterFunc(k.ctx, func() {
		timer := time.NewTimer(stuckWriteGrace)
		defer timer.Stop()
		select {
		case <-sending:
		case <-timer.C:
			k.p.opts.Logger.Warn("rabbitmq: a write to the broker is stuck; closing the connection", "url", k.p.redacted)
			k.s.kill()
		}
	})
	return func() {
		close(sending)
		stopWatchdog()
	}
}

// reserve takes a token of p.sem for the next message, settling the call's
// own oldest message if its confirm comes first (so that a batch larger
// than MaxInFlight cannot deadlock). It returns false if ctx ends first.
func (k *call) reserve() bool {
	for {
		if k.ctx.Err() != nil {
			return false
		}
		var oldest <-chan struct{}
		if k.settled < k.sent {
			dc := k.batch[k.settled].dc
			if dc == nil {
				k.settle()
				continue
			}
			oldest = dc.Done()
		}
		select {
		case k.p.sem <- struct{}{}:
			return true
		case <-oldest:
			k.settle()
		case <-k.ctx.Done():
		}
	}
}

// settle sets the result of the oldest message not settled, waiting for
// its confirm, and gives back its token.
func (k *call) settle() {
	in := k.batch[k.settled]
	k.settled++
	if in.dc == nil { // not published
		return
	}
	<-in.dc.Done()
	k.errs[in.index] = k.p.result(k.c, in, k.msgs[in.index])
	<-k.p.sem
}

// failRest sets err, for each message not sent yet, as its result.
func (k *call) failRest(err error) {
	for _, in := range k.batch[k.sent:] {
		k.errs[in.index] = k.p.blockedUnlessCancelled(k.ctx, k.msgs[in.index], err)
	}
	k.sent = len(k.batch)
}

// await waits for the confirms of the messages sent, in order, until ctx
// ends; then it abandons the rest.
func (k *call) await() {
	for k.settled < k.sent {
		in := k.batch[k.settled]
		if in.dc == nil {
			k.settled++
			continue
		}
		select {
		case <-in.dc.Done():
			k.settle()
		case <-k.ctx.Done():
			k.abandon()
			return
		}
	}
}

// abandon sets the results of the messages sent and not settled once ctx
// has ended: those confirmed meanwhile count, the others fail. Their tokens
// are given back once their confirms arrive, by a collector bounded by
// PublishTimeout.
func (k *call) abandon() {
	p := k.p
	var rest []*inflight
	for _, in := range k.batch[k.settled:k.sent] {
		if in.dc == nil {
			continue
		}
		select {
		case <-in.dc.Done():
			k.errs[in.index] = p.result(k.c, in, k.msgs[in.index])
			<-p.sem
		default:
			k.errs[in.index] = p.blockedUnlessCancelled(k.ctx, k.msgs[in.index], fmt.Errorf("rabbitmq: publish to exchange %q with routing key %q: not confirmed (the message may still be delivered): %w",
				p.opts.Exchange, in.routingKey, context.Cause(k.ctx)))
			rest = append(rest, in)
		}
	}
	k.settled = k.sent
	p.collect(k.s, k.c, rest)
}

// collect gives back the tokens of abandoned messages once their confirms
// arrive. If they do not arrive within PublishTimeout, the connection is
// considered stuck and killed, which settles them.
func (p *Publisher) collect(s *session, c *channel, rest []*inflight) {
	if len(rest) == 0 {
		return
	}
	p.bg.Go(func() {
		timer := time.NewTimer(p.opts.PublishTimeout)
		defer timer.Stop()
		for _, in := range rest {
			select {
			case <-in.dc.Done():
			case <-timer.C:
				p.opts.Logger.Warn("rabbitmq: confirms overdue; closing the connection", "url", p.redacted, "overdue", len(rest))
				s.kill()
				<-in.dc.Done()
			}
			c.collectReturns() // keep the returns buffer from filling up
			<-p.sem
		}
	})
}

// result is the outcome of a message whose confirmation is done.
func (p *Publisher) result(c *channel, in *inflight, m *outbox.Message) error {
	c.collectReturns()
	if r := c.returnOf(in); r != nil {
		return outbox.Blocked(m.Topic, fmt.Errorf("rabbitmq: message %s of topic %q is unroutable: exchange %q has no queue bound for routing key %q (%d %s); bind a queue to the exchange for this routing key, or map the topic to another routing key",
			m.ID, m.Topic, p.opts.Exchange, in.routingKey, r.ReplyCode, r.ReplyText))
	}
	if in.dc.Acked() {
		return nil
	}
	if c.closed() {
		return p.lostError(m, p.channelLost(c, "not confirmed (the message may still be delivered)"))
	}
	return outbox.Blocked(m.Topic, fmt.Errorf("rabbitmq: publish to exchange %q with routing key %q: the broker refused the message (basic.nack: a queue full with overflow reject-publish, or an internal error); let consumers catch up or raise the queue's max-length",
		p.opts.Exchange, in.routingKey))
}

// channelLost is the error of the messages in flight on c when it closed,
// with advice when the cause is known: the exchange is missing, or the user
// lacks a permission.
func (p *Publisher) channelLost(c *channel, what string) error {
	cause := c.closeErr()
	err := fmt.Errorf("rabbitmq: publish to exchange %q: %s: channel closed: %w", p.opts.Exchange, what, cause)
	var ae *amqp.Error
	if errors.As(cause, &ae) {
		switch {
		case ae.Code == amqp.NotFound && p.opts.PassiveExchange:
			return fmt.Errorf("%w; declare exchange %q, or unset PassiveExchange", err, p.opts.Exchange)
		case ae.Code == amqp.NotFound:
			return fmt.Errorf("%w; the exchange was deleted: the next channel declares it again", err)
		case ae.Code == amqp.AccessRefused:
			return fmt.Errorf("%w; grant the user the write permission on exchange %q", err, p.opts.Exchange)
		}
	}
	return err
}

// lostError classifies err, the loss of m's channel or connection: retryable
// if the broker closed the channel over a precondition (something about
// what was sent), else blocking m's topic (the exchange missing, access
// refused, the connection lost: the destination or the broker, and m's
// outcome unknown).
func (p *Publisher) lostError(m *outbox.Message, err error) error {
	var ae *amqp.Error
	if errors.As(err, &ae) && ae.Code == amqp.PreconditionFailed {
		return err
	}
	return outbox.Blocked(m.Topic, err)
}

// blockedUnlessCancelled classifies err, a failure to publish or confirm m
// that is not the message's doing (no connection, publishers blocked, the
// deadline passed): blocking m's topic, unless ctx was cancelled, which says
// nothing about the broker: then retryable.
func (p *Publisher) blockedUnlessCancelled(ctx context.Context, m *outbox.Message, err error) error {
	if errors.Is(ctx.Err(), context.Canceled) {
		return err
	}
	return outbox.Blocked(m.Topic, err)
}

// check returns the permanent error of a message that cannot be published.
func (p *Publisher) check(s *session, m *outbox.Message, key string) error {
	if m.ID == "" {
		return outbox.Permanent(errors.New("rabbitmq: message has no ID: messages must be written through a store (or prepared with Message.Prepare)"))
	}
	if key == "" || len(key) > MaxRoutingKeyLen {
		return outbox.Permanent(fmt.Errorf("rabbitmq: topic %q maps to a routing key of %d bytes; AMQP allows 1 to %d: change the topic or Options.RoutingKey", m.Topic, len(key), MaxRoutingKeyLen))
	}
	if len(m.Payload) > p.opts.MaxMessageSize {
		return outbox.Permanent(fmt.Errorf("rabbitmq: message %s of topic %q has a payload of %d bytes, over MaxMessageSize (%d, the broker's max_message_size): shrink the payload, or raise max_message_size in rabbitmq.conf and MaxMessageSize",
			m.ID, m.Topic, len(m.Payload), p.opts.MaxMessageSize))
	}
	// The content header frame (properties and headers) cannot be split:
	// it must fit in frame_max, or the broker closes the connection.
	if s.frameMax > 0 {
		if n := headerFrameSize(m, key); n > s.frameMax {
			return outbox.Permanent(fmt.Errorf("rabbitmq: message %s of topic %q has headers of about %d bytes, over the connection's frame_max (%d): send fewer or smaller headers",
				m.ID, m.Topic, n, s.frameMax))
		}
	}
	return nil
}

// headerFrameSize estimates (from above) the size of the content header
// frame carrying m's properties.
func headerFrameSize(m *outbox.Message, key string) int {
	n := 64 + 3*len(m.ID) + len(m.Topic) + len(key) + len(m.Key) + 64 // fixed fields, ids, type, created-at
	for k, v := range m.Headers {
		n += 1 + len(k) + 1 + 4 + len(v)
		if strings.EqualFold(k, "Content-Type") {
			n += 1 + len(v)
		}
	}
	return n + 6*16 // our header names and their encoding
}

// publishing builds the AMQP message for m, with content type ct when not
// empty (a CloudEvent's), else m's Content-Type header's or
// application/octet-stream.
func (p *Publisher) publishing(m *outbox.Message, ct string) amqp.Publishing {
	h := make(amqp.Table, len(m.Headers)+3)
	contentType := "application/octet-stream"
	for k, v := range m.Headers {
		h[k] = v
		if strings.EqualFold(k, "Content-Type") {
			contentType = v
		}
	}
	if ct != "" {
		contentType = ct
	}
	// Ours last: a reserved name in m.Headers (rejected by Validate) cannot
	// override them.
	h[outbox.HeaderID] = m.ID
	if m.Key != "" {
		h[outbox.HeaderKey] = m.Key
	}
	if !m.CreatedAt.IsZero() {
		h[outbox.HeaderCreatedAt] = m.CreatedAt.UTC().Format(time.RFC3339Nano)
	}
	mode := amqp.Persistent
	if p.opts.Transient {
		mode = amqp.Transient
	}
	return amqp.Publishing{
		Headers:      h,
		ContentType:  contentType,
		DeliveryMode: mode,
		MessageId:    m.ID,
		Type:         m.Topic,
		Timestamp:    m.CreatedAt,
		Body:         m.Payload,
	}
}
