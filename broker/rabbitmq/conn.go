package rabbitmq

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// session is one AMQP connection and the publishing channels opened on it.
// A session is never reused once its connection is gone: the Publisher dials
// a new one.
type session struct {
	conn     *amqp.Connection
	raw      net.Conn // the TCP connection under conn, closed to unblock stuck writes
	frameMax int      // negotiated frame_max; 0 means unlimited

	done chan struct{} // closed when the connection is gone
	err  error         // why; written before done is closed

	// blocked holds the broker's reason while it blocks publishers
	// (connection.blocked, a memory or disk alarm), nil otherwise.
	blocked atomic.Pointer[string]

	// chans are the publishing channels, opened lazily and replaced when the
	// broker closes one; guarded by the Publisher's lock.
	chans []*channel
}

// watch follows the connection's blocked notifications and its end. It
// returns once the connection is gone.
func (s *session) watch(closes <-chan *amqp.Error, blocks <-chan amqp.Blocking) {
	for {
		select {
		case b, ok := <-blocks:
			if !ok {
				blocks = nil
				continue
			}
			if b.Active {
				reason := b.Reason
				s.blocked.Store(&reason)
			} else {
				s.blocked.Store(nil)
			}
		case e, ok := <-closes:
			if ok && e != nil {
				s.err = e
			} else {
				s.err = amqp.ErrClosed
			}
			close(s.done)
			return
		}
	}
}

// gone reports whether the connection is gone.
func (s *session) gone() bool {
	select {
	case <-s.done:
		return true
	default:
		return s.conn.IsClosed()
	}
}

// kill closes the TCP connection at once, without the AMQP closing
// handshake: used when the connection looks stuck (a write that does not
// return, confirms that never come). Everything in flight on it fails with
// an error blocking its topic.
func (s *session) kill() {
	_ = s.raw.Close()
}

// close closes the connection gracefully, or kills it if the broker does
// not answer within timeout.
func (s *session) close(timeout time.Duration) {
	if err := s.conn.CloseDeadline(time.Now().Add(timeout)); err != nil && !errors.Is(err, amqp.ErrClosed) {
		s.kill()
	}
}

// channel is an AMQP channel in confirm mode, with the bookkeeping that
// matches basic.return to the messages waiting for their confirm.
type channel struct {
	ch      *amqp.Channel
	closes  chan *amqp.Error
	closeMu sync.Mutex
	closeEr error // the reason the channel closed, once known

	mu      sync.Mutex
	returns chan amqp.Return // nil once closed by the library
	// waiting holds, by message ID, the messages published with the
	// mandatory flag on this channel and not yet settled, in publish order.
	waiting map[string][]*inflight
}

// inflight is a message published and awaiting its confirm.
type inflight struct {
	index      int // in the batch
	id         string
	routingKey string
	dc         *amqp.DeferredConfirmation
	returned   *amqp.Return // set by collectReturns, under channel.mu
}

// openChannel opens a channel in confirm mode and, unless passive, declares
// the exchange on it (cheap, and it brings back an exchange deleted
// meanwhile). returnsCap is the capacity of the returns buffer: at least
// the number of messages that can be in flight on the channel, so that the
// library never waits for room (it drops a return after 5 s without room).
func (s *session) openChannel(opts *Options, returnsCap int) (*channel, error) {
	ch, err := s.conn.Channel()
	if err != nil {
		return nil, fmt.Errorf("rabbitmq: open channel: %w", err)
	}
	if err := ch.Confirm(false); err != nil {
		return nil, fmt.Errorf("rabbitmq: enable publisher confirms: %w", err)
	}
	if !opts.PassiveExchange {
		if err := declareExchange(ch, opts); err != nil {
			return nil, err
		}
	}
	c := &channel{
		ch:      ch,
		closes:  ch.NotifyClose(make(chan *amqp.Error, 1)),
		returns: ch.NotifyReturn(make(chan amqp.Return, returnsCap)),
		waiting: make(map[string][]*inflight),
	}
	return c, nil
}

// declareExchange declares opts.Exchange (a durable topic exchange), or
// checks that it exists if opts.PassiveExchange is set. ch is closed by the
// broker if that fails.
func declareExchange(ch *amqp.Channel, opts *Options) error {
	if opts.PassiveExchange {
		err := ch.ExchangeDeclarePassive(opts.Exchange, amqp.ExchangeTopic, true, false, false, false, nil)
		if err == nil {
			return nil
		}
		var ae *amqp.Error
		if errors.As(err, &ae) && ae.Code == amqp.NotFound {
			return fmt.Errorf("rabbitmq: exchange %q does not exist: declare it, or unset PassiveExchange to let the publisher declare it: %w", opts.Exchange, err)
		}
		return fmt.Errorf("rabbitmq: check exchange %q: %w", opts.Exchange, err)
	}
	err := ch.ExchangeDeclare(opts.Exchange, amqp.ExchangeTopic, true, false, false, false, nil)
	if err == nil {
		return nil
	}
	var ae *amqp.Error
	if errors.As(err, &ae) {
		switch ae.Code {
		case amqp.PreconditionFailed:
			return fmt.Errorf("rabbitmq: exchange %q exists with other settings than a durable topic exchange: use another Exchange, or set PassiveExchange to publish to it as it is: %w", opts.Exchange, err)
		case amqp.AccessRefused:
			return fmt.Errorf("rabbitmq: the user may not declare exchange %q: grant it the configure permission, or declare the exchange elsewhere and set PassiveExchange: %w", opts.Exchange, err)
		}
	}
	return fmt.Errorf("rabbitmq: declare exchange %q: %w", opts.Exchange, err)
}

// closed reports whether the channel is closed.
func (c *channel) closed() bool { return c.ch.IsClosed() }

// closeErr returns why the channel closed. Call it only once closed()
// reports true; it waits (briefly) for the library to deliver the reason.
func (c *channel) closeErr() error {
	c.closeMu.Lock()
	defer c.closeMu.Unlock()
	if c.closeEr != nil {
		return c.closeEr
	}
	timer := time.NewTimer(time.Second)
	defer timer.Stop()
	select {
	case e, ok := <-c.closes:
		if ok && e != nil {
			c.closeEr = e
		} else {
			c.closeEr = amqp.ErrClosed
		}
	case <-timer.C:
		return amqp.ErrClosed
	}
	return c.closeEr
}

// register records msgs as waiting for a possible basic.return.
func (c *channel) register(msgs []*inflight) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, m := range msgs {
		c.waiting[m.id] = append(c.waiting[m.id], m)
	}
}

// unregister forgets msgs.
func (c *channel) unregister(msgs []*inflight) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, m := range msgs {
		list := c.waiting[m.id]
		for i, w := range list {
			if w == m {
				list = append(list[:i], list[i+1:]...)
				break
			}
		}
		if len(list) == 0 {
			delete(c.waiting, m.id)
		} else {
			c.waiting[m.id] = list
		}
	}
}

// collectReturns takes every basic.return the library has delivered so far
// and attaches it to the message it belongs to (by message ID; returns of a
// message with several copies in flight go to the oldest copy).
//
// The library's reader goroutine hands a basic.return to the returns buffer
// before it processes the basic.ack that the broker sends after it, and it
// completes a DeferredConfirmation only while processing that ack (or when
// the channel closes). So once a message's confirmation is done, calling
// collectReturns is enough to see that message's return, if any.
func (c *channel) collectReturns() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for c.returns != nil {
		select {
		case r, ok := <-c.returns:
			if !ok {
				c.returns = nil
				return
			}
			for _, m := range c.waiting[r.MessageId] {
				if m.returned == nil {
					m.returned = &r
					break
				}
			}
		default:
			return
		}
	}
}

// returnOf returns the basic.return attached to m, if any.
func (c *channel) returnOf(m *inflight) *amqp.Return {
	c.mu.Lock()
	defer c.mu.Unlock()
	return m.returned
}

// dialSession connects to url and declares (or checks) the exchange. ctx and
// opts.DialTimeout bound the attempt.
func dialSession(ctx context.Context, url string, opts *Options, wg *sync.WaitGroup) (*session, error) {
	deadline := time.Now().Add(opts.DialTimeout)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	var raw net.Conn
	cfg := amqp.Config{
		Heartbeat:       opts.Heartbeat,
		TLSClientConfig: opts.TLS,
		Locale:          "en_US",
		Properties: amqp.Table{
			"product":         "outbox",
			"connection_name": opts.ConnectionName,
		},
		Dial: func(network, addr string) (net.Conn, error) {
			d := net.Dialer{Deadline: deadline}
			c, err := d.DialContext(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			// Bounds the TLS and AMQP handshakes; the library clears it
			// once the connection is open.
			if err := c.SetDeadline(deadline); err != nil {
				c.Close()
				return nil, err
			}
			raw = c
			return c, nil
		},
	}
	conn, err := amqp.DialConfig(url, cfg)
	if err != nil {
		return nil, err
	}
	s := &session{
		conn:     conn,
		raw:      raw,
		frameMax: conn.Config.FrameSize,
		done:     make(chan struct{}),
	}
	closes := conn.NotifyClose(make(chan *amqp.Error, 1))
	blocks := conn.NotifyBlocked(make(chan amqp.Blocking, 8))
	wg.Go(func() { s.watch(closes, blocks) })

	// Declare or check the exchange on a channel of its own: a failure
	// closes that channel.
	ch, err := conn.Channel()
	if err == nil {
		err = declareExchange(ch, opts)
		if err == nil {
			err = ch.Close()
		}
	}
	if err != nil {
		s.close(time.Second)
		return nil, err
	}
	s.chans = make([]*channel, opts.Channels)
	return s, nil
}
