package backends

import (
	"context"
	"errors"
	"fmt"
	"net/url"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outboxrelay/outbox"
	"github.com/outboxrelay/outbox/broker/rabbitmq"
)

// RabbitMQ broker: amqp://user:password@host:5672/vhost (amqps:// for TLS;
// the default vhost "/" is written %2F or left out), publishing with
// confirms to a durable topic exchange with the topic as routing key, such
// as amqp://guest:guest@127.0.0.1:5672/?exchange=outbox.
//
// TLS (amqps://) takes its CA and client certificate from BrokerOptions.TLS
// or the URL's cacertfile, certfile and keyfile; BrokerOptions.AMQP.Password
// replaces the URL's password.
//
// Query parameters (see rabbitmq.ParseURL): exchange (default "outbox"),
// passive_exchange, transient, allow_unroutable, channels,
// max_message_size, connection_name, connection_timeout (milliseconds), and
// those amqp091-go reads itself (heartbeat, channel_max, auth_mechanism,
// certfile, keyfile, cacertfile, server_name_indication); plus the outbox's
// own: prefix (put before every routing key), max_in_flight, ack_timeout
// (the publish timeout).
func init() {
	RegisterBroker("amqp", openRabbitMQ)
	RegisterBroker("amqps", openRabbitMQ)
}

func openRabbitMQ(ctx context.Context, u *url.URL, o BrokerOptions) (outbox.Publisher, error) {
	amqpURL, opts, err := rabbitmq.ParseURL(u.String())
	if err != nil {
		return nil, Invalid(BrokerFlag, "%v", err)
	}
	if o.MaxInFlight != 0 {
		opts.MaxInFlight = o.MaxInFlight
	}
	if o.AckTimeout != 0 {
		opts.PublishTimeout = o.AckTimeout
	}
	if prefix := o.SubjectPrefix; prefix != "" {
		opts.RoutingKey = func(topic string) string { return prefix + topic }
	}
	opts.Logger = o.Logger
	opts.CloudEvents = o.CloudEvents
	if err := opts.Validate(); err != nil {
		return nil, Invalid(BrokerFlag, "%v", err)
	}
	if opts.TLS, err = o.TLS.Config(); err != nil {
		return nil, err
	}
	if amqpURL, err = amqpURLWithPassword(amqpURL, o); err != nil {
		return nil, err
	}
	p, err := rabbitmq.Dial(ctx, amqpURL, opts)
	if err != nil {
		if errors.Is(err, amqp.ErrCredentials) && o.AMQP.Password != "" {
			return nil, fmt.Errorf("RabbitMQ refused the password of --amqp-password-file for the user in --broker: %w", err)
		}
		if why := tlsRefusal(err, o.TLS); why != "" {
			return nil, fmt.Errorf("%s: %w", why, err)
		}
		return nil, err
	}
	return p, nil
}

// amqpURLWithPassword puts o.AMQP.Password (--amqp-password-file) into
// amqpURL, which must name the user and no password.
func amqpURLWithPassword(amqpURL string, o BrokerOptions) (string, error) {
	if o.AMQP.Password == "" {
		return amqpURL, nil
	}
	au, err := url.Parse(amqpURL)
	if err != nil || au.User == nil || au.User.Username() == "" {
		return "", Invalid("--amqp-password-file", "needs the user name in --broker, such as amqps://relay@rabbit.example:5671/")
	}
	if _, has := au.User.Password(); has {
		return "", Invalid("--amqp-password-file", "and a password in --broker are two passwords; remove the one in the URL")
	}
	au.User = url.UserPassword(au.User.Username(), o.AMQP.Password)
	return au.String(), nil
}
