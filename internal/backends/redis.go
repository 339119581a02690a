package backends

import (
	"context"
	"fmt"
	"log/slog"
	"net/url"

	goredis "github.com/redis/go-redis/v9"

	"github.com/outboxrelay/outbox"
	"github.com/outboxrelay/outbox/broker/redis"
)

// Redis Streams broker: redis://[user[:password]@]host:6379[/db]
// (rediss:// for TLS), one XADD per message to the stream named after the
// topic (with prefix before it), such as
// redis://relay@127.0.0.1:6379/0?password_file=/run/secrets/redis.
//
// The password may sit in the URL (it is never printed) or, better, in a
// file: password_file. TLS (rediss://) takes its CA and client
// certificate from BrokerOptions.TLS.
//
// Query parameters (see redis.ParseURL): create_streams (let XADD create
// missing streams; by default a missing stream blocks its topic), maxlen
// (MAXLEN ~ N trimming), max_message_bytes, publish_timeout, dial_timeout,
// pool_size, client_name, password_file; plus the outbox's own: prefix
// (put before every stream key), ack_timeout (the publish timeout).
func init() {
	RegisterBroker("redis", openRedis)
	RegisterBroker("rediss", openRedis)
}

func openRedis(ctx context.Context, u *url.URL, o BrokerOptions) (outbox.Publisher, error) {
	opts, err := redis.ParseURL(u.String())
	if err != nil {
		return nil, Invalid(BrokerFlag, "%v", err)
	}
	if o.MaxInFlight != 0 {
		return nil, Invalid("--max-in-flight", "does not apply to Redis: a batch is one pipeline; bound the concurrent pipelines with ?pool_size= in --broker")
	}
	if o.AckTimeout != 0 {
		opts.PublishTimeout = o.AckTimeout
	}
	if prefix := o.SubjectPrefix; prefix != "" {
		opts.StreamMapper = func(topic string) string { return prefix + topic }
	}
	opts.Logger = o.Logger
	opts.CloudEvents = o.CloudEvents
	if err := opts.Validate(); err != nil {
		return nil, Invalid(BrokerFlag, "%v", err)
	}
	if o.TLS.enabled() {
		if u.Scheme != "rediss" {
			return nil, Invalid(BrokerFlag, "uses redis://, but TLS options are given (%v); use rediss:// for TLS", o.TLS.given())
		}
		cfg, err := o.TLS.Config()
		if err != nil {
			return nil, err
		}
		cfg.ServerName = opts.TLS.ServerName
		opts.TLS = cfg
	}
	// go-redis logs (dial failures while the server is down, …) through
	// one process-wide logger: the CLI's, at debug level.
	goredis.SetLogger(redisLogger{o.Logger})
	p, err := redis.Dial(ctx, opts)
	if err != nil {
		if why := tlsRefusal(err, o.TLS); why != "" {
			return nil, fmt.Errorf("%s: %w", why, err)
		}
		return nil, err
	}
	return p, nil
}

// redisLogger passes go-redis's log lines to a slog.Logger at debug level.
type redisLogger struct{ l *slog.Logger }

func (r redisLogger) Printf(ctx context.Context, format string, v ...any) {
	if r.l != nil {
		r.l.DebugContext(ctx, "redis: "+fmt.Sprintf(format, v...))
	}
}
