package redis

import (
	"cmp"
	"crypto/tls"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"time"

	"github.com/outboxrelay/outbox/broker/internal/optcheck"
	"github.com/outboxrelay/outbox/cloudevents"
)

// Defaults and limits of [Options].
const (
	// DefaultPort is the port of an address given without one.
	DefaultPort = 6379

	// PublishTimeoutDefault bounds a Publish call whose context has no
	// deadline.
	PublishTimeoutDefault = 10 * time.Second
	// PublishTimeoutMin is the smallest PublishTimeout accepted.
	PublishTimeoutMin = time.Millisecond

	// DialTimeoutDefault bounds connecting to the server.
	DialTimeoutDefault = 5 * time.Second

	// PoolSizeDefault is how many connections the client keeps at most:
	// each Publish call pipelines its batch on one.
	PoolSizeDefault = 10
	// PoolSizeMax is the largest PoolSize accepted.
	PoolSizeMax = 1000

	// MaxMessageBytesDefault bounds an entry: payload, key, headers and the
	// outbox's fields. Redis itself takes bulk strings up to its
	// proto-max-bulk-len (512 MB), far beyond what a stream entry should
	// hold; a message over MaxMessageBytes fails permanently without being
	// sent.
	MaxMessageBytesDefault = 1 << 20
	// MaxMessageBytesMax is the largest MaxMessageBytes accepted (Redis's
	// default proto-max-bulk-len).
	MaxMessageBytesMax = 512 << 20

	// MaxStreamKeyLen bounds a stream's key (Redis accepts keys up to
	// 512 MB; a longer name is a mistake in the mapping).
	MaxStreamKeyLen = 1024
)

// Entry field names. Each entry holds the payload, the outbox's fields and
// one field per header; names never collide: header fields carry the
// "header." prefix, and the others are fixed.
const (
	// FieldPayload holds Message.Payload.
	FieldPayload = "payload"
	// FieldID holds Message.ID: consumers drop the duplicates that
	// at-least-once delivery allows by it.
	FieldID = "outbox.id"
	// FieldKey holds Message.Key (absent when empty).
	FieldKey = "outbox.key"
	// FieldCreatedAt holds Message.CreatedAt as RFC 3339 with nanoseconds,
	// UTC (absent when zero).
	FieldCreatedAt = "outbox.created_at"
	// HeaderFieldPrefix starts the field of each header: header
	// "traceparent" is field "header.traceparent".
	HeaderFieldPrefix = "header."
)

// Options configures a [Publisher]. Addr is required; every other field has
// a default.
type Options struct {
	// Addr is the server's host:port.
	Addr string
	// Username and Password authenticate the connection (AUTH): an ACL user
	// and its password, or only Password for the default user
	// (requirepass). Empty: no authentication.
	Username, Password string
	// DB is the database number (SELECT), default 0.
	DB int
	// TLS, if not nil, connects with TLS (rediss://).
	TLS *tls.Config

	// StreamMapper maps a message's Topic to its stream's key (default: the
	// topic itself). It is called concurrently; a result that is empty or
	// longer than MaxStreamKeyLen fails the message permanently.
	StreamMapper func(topic string) string
	// CreateStreams lets XADD create a stream that does not exist. By
	// default a message to a missing stream fails with an error blocking
	// its topic (XADD NOMKSTREAM): the relay waits, spending no attempt,
	// until the stream exists (create it with XGROUP CREATE … MKSTREAM, or
	// set CreateStreams), so that a stream deleted by mistake, with its
	// consumer groups, is not silently recreated without them.
	CreateStreams bool
	// MaxLen, if above 0, trims each stream to about that many entries on
	// every XADD (MAXLEN ~ MaxLen: Redis trims whole macro nodes, so a
	// stream may hold somewhat more). Trimmed entries are gone whether or
	// not a consumer read them. Default 0: no trimming.
	MaxLen int64
	// MaxMessageBytes bounds an entry, the payload with the key, headers
	// and outbox fields (default MaxMessageBytesDefault, at most
	// MaxMessageBytesMax); a message over it fails permanently.
	MaxMessageBytes int

	// PublishTimeout bounds a Publish call whose context has no deadline
	// (default PublishTimeoutDefault).
	PublishTimeout time.Duration
	// DialTimeout bounds connecting (default DialTimeoutDefault).
	DialTimeout time.Duration
	// PoolSize bounds the connections (default PoolSizeDefault): at most
	// that many Publish calls are on the wire at once; others wait for a
	// connection within their deadline.
	PoolSize int
	// ClientName, if set, is the name the server shows in CLIENT LIST
	// (CLIENT SETNAME: an ACL user then needs +client|setname too).
	// Default: none.
	ClientName string
	// CloudEvents, if set, publishes every message as a CloudEvent
	// (cloudevents.Redis): in binary mode the event's attributes are
	// "header.ce-<name>" fields and the payload is the data; in structured
	// mode the payload is the event as JSON and the field
	// "header.Content-Type" says so. The outbox fields stay. Consumers read
	// the headers (the fields after "header.") with cloudevents.MapHeaders
	// and cloudevents.Decode(cloudevents.Redis, …). Default: off.
	CloudEvents *cloudevents.Options

	// Logger receives the publisher's warnings. Default: discard.
	Logger *slog.Logger
}

// WithDefaults returns o with the zero fields set to their defaults.
func (o Options) WithDefaults() Options {
	if o.StreamMapper == nil {
		o.StreamMapper = func(topic string) string { return topic }
	}
	o.MaxMessageBytes = cmp.Or(o.MaxMessageBytes, MaxMessageBytesDefault)
	o.PublishTimeout = cmp.Or(o.PublishTimeout, PublishTimeoutDefault)
	o.DialTimeout = cmp.Or(o.DialTimeout, DialTimeoutDefault)
	o.PoolSize = cmp.Or(o.PoolSize, PoolSizeDefault)
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	return o
}

// Validate reports whether o, with its defaults, is usable: the error Dial
// would return without connecting, naming the field.
func (o Options) Validate() error {
	return o.WithDefaults().validate()
}

// validate checks o after WithDefaults, naming the field in its errors.
func (o Options) validate() error {
	host, port, err := net.SplitHostPort(o.Addr)
	if err == nil && host == "" {
		err = fmt.Errorf("no host")
	}
	if err == nil {
		var n int
		if n, err = strconv.Atoi(port); err == nil && (n < 1 || n > 65535) {
			err = fmt.Errorf("port %d out of range", n)
		}
	}
	if err != nil {
		return fmt.Errorf("redis: Addr %q is not host:port (%v); give an address such as 127.0.0.1:6379", o.Addr, err)
	}
	c := optcheck.Check("redis")
	c.Failf(o.Username != "" && o.Password == "", "Username %q is given without Password; an ACL user needs its password", o.Username)
	c.Failf(o.DB < 0, "DB must not be negative, got %d", o.DB)
	c.Failf(o.MaxLen < 0, "MaxLen must not be negative (0: no trimming), got %d", o.MaxLen)
	c.Between("MaxMessageBytes", o.MaxMessageBytes, 1, MaxMessageBytesMax)
	c.AtLeast("PublishTimeout", o.PublishTimeout, PublishTimeoutMin)
	c.AtLeast("DialTimeout", o.DialTimeout, time.Millisecond)
	c.Between("PoolSize", o.PoolSize, 1, PoolSizeMax)
	if o.CloudEvents != nil {
		err := o.CloudEvents.WithDefaults().Validate()
		c.Failf(err != nil, "CloudEvents: %w", err)
	}
	return c.Err()
}
