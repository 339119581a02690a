package redis

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/outboxrelay/outbox"
	"github.com/outboxrelay/outbox/broker/internal/pubgate"
	"github.com/outboxrelay/outbox/cloudevents"
)

// Publisher appends outbox messages to Redis streams with XADD. It
// implements [outbox.Publisher]: a batch goes as one pipeline on one
// connection, and Publish returns one result per message once the server
// answered each XADD. It classifies each failure as [outbox.Permanent]
// (the message can never be added), [outbox.Blocked] (the stream or the
// server is unusable, or the outcome unknown) or retryable (see Publish).
// Neither the Publisher nor its client retries (go-redis's retries are
// off).
//
// Each message becomes an entry of stream StreamMapper(Topic) with the
// fields (see the Field constants):
//
//   - outbox.id: Message.ID, for consumers to drop duplicates;
//   - outbox.key: Message.Key (when not empty);
//   - outbox.created_at: Message.CreatedAt, RFC 3339 with nanoseconds, UTC
//     (when not zero);
//   - header.NAME: the value of each header NAME (trace context included);
//   - payload: Message.Payload.
//
// The entry ID is the server's (XADD *): time-ordered in the stream.
//
// A Publisher is safe for concurrent use.
type Publisher struct {
	client *goredis.Client
	opts   Options
	gate   *pubgate.Gate
	ce     *cloudevents.Encoder // nil: CloudEvents off
}

// Dial creates a client for opts.Addr and checks with PING that the server
// answers and accepts the credentials. ctx bounds the check. Errors name
// the address (never the password) and say what to change.
func Dial(ctx context.Context, opts Options) (*Publisher, error) {
	opts = opts.WithDefaults()
	if err := opts.validate(); err != nil {
		return nil, err
	}
	ce, err := cloudevents.New(opts.CloudEvents, cloudevents.Redis)
	if err != nil {
		return nil, fmt.Errorf("redis: Options.CloudEvents: %w", err)
	}
	client := goredis.NewClient(&goredis.Options{
		Addr:       opts.Addr,
		Username:   opts.Username,
		Password:   opts.Password,
		DB:         opts.DB,
		TLSConfig:  opts.TLS,
		ClientName: opts.ClientName,
		// The relay retries; a retry inside the client could reorder a
		// key's messages and would hide failures from the relay.
		MaxRetries:  -1,
		DialTimeout: opts.DialTimeout,
		// Each call's deadline is its context's (Publish always has one).
		ReadTimeout:           -1,
		WriteTimeout:          -1,
		ContextTimeoutEnabled: true,
		PoolSize:              opts.PoolSize,
		// CLIENT SETINFO would need one more ACL permission.
		DisableIdentity: true,
	})
	if err := client.Ping(ctx).Err(); err != nil {
		client.Close()
		return nil, dialError(opts, err)
	}
	gate := pubgate.New(pubgate.Config{Name: "redis", Timeout: opts.PublishTimeout, TimeoutField: "PublishTimeout", Awaited: "reply"})
	return &Publisher{client: client, opts: opts, gate: gate, ce: ce}, nil
}

// dialError says what to change after a failed PING.
func dialError(opts Options, err error) error {
	var re goredis.Error
	switch {
	case errors.As(err, &re) && (hasPrefix(err, "WRONGPASS") || hasPrefix(err, "NOAUTH") || strings.Contains(err.Error(), "invalid password")):
		who := "the default user"
		if opts.Username != "" {
			who = "user " + opts.Username
		}
		return fmt.Errorf("redis: server %s refused the credentials of %s: check the user name and password: %w", opts.Addr, who, err)
	case errors.As(err, &re):
		return fmt.Errorf("redis: server %s: %w", opts.Addr, err)
	}
	return fmt.Errorf("redis: no server answers at %s: %w; check the address, TLS (rediss://) and the network", opts.Addr, err)
}

// Client returns the go-redis client, for administration. Do not close it:
// Close does.
func (p *Publisher) Client() *goredis.Client { return p.client }

// Stream returns the stream key of an outbox topic: StreamMapper(topic).
func (p *Publisher) Stream(topic string) string { return p.opts.StreamMapper(topic) }

// Close makes later Publish calls fail with [outbox.ErrClosed], waits for
// the calls in progress to return, and closes the client. Calling Close
// again returns nil.
func (p *Publisher) Close() error {
	if p.gate.Close() {
		return p.client.Close()
	}
	return nil
}

// Publish implements [outbox.Publisher]. It sends one XADD per message in
// one pipeline and waits for the replies until ctx ends (or PublishTimeout
// passes, if ctx has no deadline). It returns one result per message: nil
// when the server added the entry. (Redis has no de-duplication: a message
// published twice is two entries with the same outbox.id.) Errors are
// classified:
//
//   - the message itself can never be added: no ID, a stream key that is
//     empty or too long, an entry over MaxMessageBytes: [outbox.Permanent],
//     without sending it;
//   - the stream or the server is unusable, or the outcome unknown: the
//     stream does not exist (unless CreateStreams), the key holds another
//     type (WRONGTYPE), the user may not write it (NOPERM, NOAUTH,
//     WRONGPASS), the server is out of memory (OOM), read-only, loading,
//     busy or cannot persist (MISCONF), the connection is refused or broke,
//     or ctx's deadline passed before the reply: [outbox.Blocked] with the
//     message's topic as destination;
//   - anything else (another error reply, a socket timeout within the
//     deadline, a cancelled ctx): retryable.
//
// The XADDs of a pipeline run in order on one connection; the relay passes
// one message per key per call, so a key's entries are added in the order
// the relay publishes them.
//
// Publish may be called concurrently. It does not retain msgs.
func (p *Publisher) Publish(ctx context.Context, msgs []*outbox.Message) []error {
	return p.gate.Do(ctx, len(msgs), func(ctx context.Context, errs []error) {
		pipe := p.client.Pipeline()
		cmds := make([]*goredis.StringCmd, len(msgs))
		streams := make([]string, len(msgs))
		sent := 0
		for i, m := range msgs {
			if p.ce != nil {
				m, _ = p.ce.Encode(m)
			}
			streams[i] = p.opts.StreamMapper(m.Topic)
			if errs[i] = p.check(m, streams[i]); errs[i] != nil {
				continue
			}
			cmds[i] = pipe.XAdd(ctx, p.args(streams[i], m))
			sent++
		}
		if sent == 0 {
			return
		}
		_, _ = pipe.Exec(ctx) // each command holds its own result
		for i, cmd := range cmds {
			if cmd != nil {
				errs[i] = p.classify(ctx, streams[i], msgs[i], cmd.Err())
			}
		}
	})
}

// check returns the permanent error of a message that can never be added.
func (p *Publisher) check(m *outbox.Message, stream string) error {
	switch {
	case m.ID == "":
		return outbox.Permanent(errors.New("redis: message has no ID: messages must be written through a store (or prepared with Message.Prepare)"))
	case stream == "" || len(stream) > MaxStreamKeyLen:
		return outbox.Permanent(fmt.Errorf("redis: topic %q maps to a stream key of %d bytes: it must be 1 to %d; change the topic or Options.StreamMapper", m.Topic, len(stream), MaxStreamKeyLen))
	}
	if n := entrySize(m); n > p.opts.MaxMessageBytes {
		return outbox.Permanent(fmt.Errorf("redis: stream %q: message %s is %d bytes with its key, headers and fields (payload %d), over MaxMessageBytes (%d): shrink it, or raise MaxMessageBytes",
			stream, m.ID, n, len(m.Payload), p.opts.MaxMessageBytes))
	}
	return nil
}

// entrySize is the size of m's entry: its field names and values.
func entrySize(m *outbox.Message) int {
	n := len(FieldID) + len(m.ID) + len(FieldPayload) + len(m.Payload) + len(FieldCreatedAt) + len(time.RFC3339Nano)
	if m.Key != "" {
		n += len(FieldKey) + len(m.Key)
	}
	for k, v := range m.Headers {
		n += len(HeaderFieldPrefix) + len(k) + len(v)
	}
	return n
}

// args builds the XADD of m to stream.
func (p *Publisher) args(stream string, m *outbox.Message) *goredis.XAddArgs {
	values := make([]string, 0, 8+2*len(m.Headers))
	values = append(values, FieldID, m.ID)
	if m.Key != "" {
		values = append(values, FieldKey, m.Key)
	}
	if !m.CreatedAt.IsZero() {
		values = append(values, FieldCreatedAt, m.CreatedAt.UTC().Format(time.RFC3339Nano))
	}
	for k, v := range m.Headers {
		values = append(values, HeaderFieldPrefix+k, v)
	}
	values = append(values, FieldPayload, string(m.Payload))
	a := &goredis.XAddArgs{Stream: stream, NoMkStream: !p.opts.CreateStreams, Values: values}
	if p.opts.MaxLen > 0 {
		a.MaxLen, a.Approx = p.opts.MaxLen, true
	}
	return a
}

// classify wraps err, the failure to add m to stream.
func (p *Publisher) classify(ctx context.Context, stream string, m *outbox.Message, err error) error {
	if err == nil {
		return nil
	}
	blocked := func(format string, args ...any) error {
		return outbox.Blocked(m.Topic, fmt.Errorf("redis: XADD to stream %q: "+format+": %w", append([]any{stream}, append(args, err)...)...))
	}
	var re goredis.Error
	switch {
	case errors.Is(err, goredis.Nil):
		return blocked("the stream does not exist: create it (XGROUP CREATE %s GROUP $ MKSTREAM) or let the publisher create streams (CreateStreams, create_streams=true)", stream)
	case errors.As(err, &re):
		switch code := strings.SplitN(err.Error(), " ", 2)[0]; code {
		case "NOPERM":
			return blocked("not authorized: grant the user +xadd on the stream's key (ACL SETUSER … ~%s +xadd)", stream)
		case "NOAUTH", "WRONGPASS":
			return blocked("the server refused the credentials")
		case "OOM":
			return blocked("the server is out of memory (maxmemory): raise maxmemory, trim the stream (MaxLen) or let consumers delete what they read")
		case "WRONGTYPE":
			return blocked("the key holds a value that is not a stream: rename or delete it, or map the topic to another key (StreamMapper)")
		case "READONLY", "LOADING", "MASTERDOWN", "BUSY", "MISCONF", "CLUSTERDOWN", "TRYAGAIN", "NOREPLICAS":
			return blocked("the server cannot take writes now (%s)", code)
		}
		return fmt.Errorf("redis: XADD to stream %q: %w", stream, err)
	case errors.Is(err, goredis.ErrClosed):
		return fmt.Errorf("redis: XADD to stream %q: %w (%w)", stream, outbox.ErrClosed, err)
	case ctx.Err() != nil && errors.Is(ctx.Err(), context.DeadlineExceeded):
		return blocked("no reply in time (the entry may still be added)")
	case ctx.Err() != nil:
		return fmt.Errorf("redis: XADD to stream %q: not answered (the entry may still be added): %w (%w)", stream, context.Cause(ctx), err)
	case isTimeout(err), errors.Is(err, goredis.ErrPoolTimeout):
		return fmt.Errorf("redis: XADD to stream %q: timed out (the entry may still be added): %w", stream, err)
	}
	// Not an error reply: the connection could not be made or broke.
	return blocked("the server is unreachable or closed the connection (the entry may still be added)")
}

// isTimeout reports whether err is a network timeout.
func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// hasPrefix reports whether err's text starts with the error code code.
func hasPrefix(err error, code string) bool {
	return strings.HasPrefix(err.Error(), code+" ") || err.Error() == code
}
