package rabbitmq

import (
	"cmp"
	"crypto/tls"
	"log/slog"
	"strings"
	"time"

	"github.com/outboxrelay/outbox/broker/internal/optcheck"
	"github.com/outboxrelay/outbox/cloudevents"
)

// Defaults and limits of [Options].
const (
	// ExchangeDefault is the exchange messages are published to.
	ExchangeDefault = "outbox"
	// MaxExchangeLen is the longest exchange name AMQP allows.
	MaxExchangeLen = 255
	// MaxRoutingKeyLen is the longest routing key AMQP allows.
	MaxRoutingKeyLen = 255

	// MaxInFlightDefault bounds the messages published and not yet
	// confirmed, across all Publish calls.
	MaxInFlightDefault = 4096
	// MaxInFlightMax is the largest MaxInFlight accepted.
	MaxInFlightMax = 1 << 20

	// ChannelsDefault is how many AMQP channels the Publisher spreads its
	// Publish calls over. A channel is one Erlang process in the broker, so
	// more channels let concurrent relay workers publish in parallel.
	ChannelsDefault = 4
	// ChannelsMax is the largest Channels accepted.
	ChannelsMax = 256

	// PublishTimeoutDefault bounds a Publish call whose context has no
	// deadline.
	PublishTimeoutDefault = 10 * time.Second
	// PublishTimeoutMin is the smallest PublishTimeout accepted.
	PublishTimeoutMin = time.Millisecond

	// DialTimeoutDefault bounds the TCP connect plus the TLS and AMQP
	// handshakes of one connection attempt.
	DialTimeoutDefault = 10 * time.Second

	// HeartbeatDefault is the AMQP heartbeat interval proposed to the broker.
	HeartbeatDefault = 10 * time.Second

	// ReconnectBackoffDefault and ReconnectBackoffMaxDefault bound the wait
	// between two failed connection attempts (exponential, with jitter).
	ReconnectBackoffDefault    = 100 * time.Millisecond
	ReconnectBackoffMaxDefault = 5 * time.Second

	// MaxMessageSizeDefault is RabbitMQ's default max_message_size (128
	// MiB); bodies larger than MaxMessageSize fail before being sent.
	MaxMessageSizeDefault = 128 << 20
	// MaxMessageSizeMax is the largest body RabbitMQ accepts at all (512
	// MiB).
	MaxMessageSizeMax = 512 << 20
)

// Options configures a [Publisher]. The zero value is valid: every field has
// a default.
type Options struct {
	// Exchange is the exchange every message is published to (default
	// ExchangeDefault). Unless PassiveExchange is set, Dial declares it as a
	// durable topic exchange (and every new channel declares it again, so
	// that it comes back if someone deletes it); declaring an exchange
	// that exists with other settings fails.
	Exchange string
	// PassiveExchange makes the Publisher check that Exchange exists instead
	// of declaring it: use it for an exchange managed elsewhere (of any
	// type, such as amq.topic) or a user without the configure permission.
	PassiveExchange bool
	// RoutingKey maps a message's Topic to its routing key (default: the
	// topic itself). It must return 1 to MaxRoutingKeyLen bytes; a message
	// whose routing key is out of range fails permanently. It is called
	// concurrently.
	RoutingKey func(topic string) string
	// Transient publishes with delivery mode 1 (non-persistent): a durable
	// queue then loses the message if the broker restarts before delivering
	// it. By default messages are persistent (delivery mode 2), and the
	// broker confirms them once persisted.
	Transient bool
	// AllowUnroutable accepts messages that no queue receives. By default
	// messages are published with the mandatory flag and a message that the
	// broker returns as unroutable blocks its topic (outbox.Blocked),
	// naming the exchange and routing key.
	AllowUnroutable bool

	// MaxInFlight bounds the messages published and not yet confirmed,
	// shared by all concurrent Publish calls (default MaxInFlightDefault, at
	// most MaxInFlightMax).
	MaxInFlight int
	// Channels is how many AMQP channels of the one connection Publish
	// calls are spread over, round robin (default ChannelsDefault, at most
	// ChannelsMax). Each call publishes its whole batch on one channel, in
	// order.
	Channels int
	// PublishTimeout bounds a Publish call whose context has no deadline
	// (default PublishTimeoutDefault). It also bounds how long confirms
	// abandoned by a cancelled call may take before the connection is
	// considered stuck and replaced.
	PublishTimeout time.Duration
	// MaxMessageSize is the largest body accepted (default
	// MaxMessageSizeDefault, RabbitMQ's own default max_message_size; at
	// most MaxMessageSizeMax). Set it to the broker's max_message_size: a
	// larger body fails permanently before it is sent, whereas the broker
	// would close the channel, failing every message in flight on it.
	MaxMessageSize int

	// DialTimeout bounds one connection attempt (default
	// DialTimeoutDefault).
	DialTimeout time.Duration
	// Heartbeat is the AMQP heartbeat interval (default HeartbeatDefault;
	// the broker may lower it).
	Heartbeat time.Duration
	// ReconnectBackoff and ReconnectBackoffMax bound the wait between two
	// failed connection attempts (defaults ReconnectBackoffDefault and
	// ReconnectBackoffMaxDefault). While waiting, Publish fails at once
	// with errors blocking the messages' topics.
	ReconnectBackoff    time.Duration
	ReconnectBackoffMax time.Duration
	// TLS configures amqps:// connections (default: the system roots and
	// the URL's host as server name).
	TLS *tls.Config
	// ConnectionName is shown by the broker (rabbitmqctl
	// list_connections, management UI) for the connection (default
	// "outbox-relay").
	ConnectionName string
	// Logger receives connection events (connection lost, reconnected,
	// channel closed by the broker). Default: discard.
	Logger *slog.Logger
	// CloudEvents, if set, publishes every message as a CloudEvent in
	// binary or structured content mode (see package cloudevents for the
	// attributes and the AMQP ("cloudEvents:" headers, datacontenttype as the content-type property) binding's header names). Default: off.
	CloudEvents *cloudevents.Options
}

// WithDefaults returns o with the zero fields set to their defaults.
func (o Options) WithDefaults() Options {
	o.Exchange = cmp.Or(o.Exchange, ExchangeDefault)
	if o.RoutingKey == nil {
		o.RoutingKey = func(topic string) string { return topic }
	}
	o.MaxInFlight = cmp.Or(o.MaxInFlight, MaxInFlightDefault)
	o.Channels = cmp.Or(o.Channels, ChannelsDefault)
	o.PublishTimeout = cmp.Or(o.PublishTimeout, PublishTimeoutDefault)
	o.MaxMessageSize = cmp.Or(o.MaxMessageSize, MaxMessageSizeDefault)
	o.DialTimeout = cmp.Or(o.DialTimeout, DialTimeoutDefault)
	o.Heartbeat = cmp.Or(o.Heartbeat, HeartbeatDefault)
	o.ReconnectBackoff = cmp.Or(o.ReconnectBackoff, ReconnectBackoffDefault)
	o.ReconnectBackoffMax = cmp.Or(o.ReconnectBackoffMax, ReconnectBackoffMaxDefault)
	o.ConnectionName = cmp.Or(o.ConnectionName, "outbox-relay")
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	return o
}

// validate checks o after WithDefaults, naming the field in its errors.
func (o Options) validate() error {
	c := optcheck.Check("rabbitmq")
	err := validateExchange(o.Exchange)
	c.Failf(err != nil, "Exchange %w", err)
	c.Failf(!o.PassiveExchange && strings.HasPrefix(o.Exchange, "amq."), "Exchange %q: names starting with \"amq.\" are reserved and cannot be declared; set PassiveExchange to publish to an existing one", o.Exchange)
	c.Between("MaxInFlight", o.MaxInFlight, 1, MaxInFlightMax)
	c.Between("Channels", o.Channels, 1, ChannelsMax)
	c.AtLeast("PublishTimeout", o.PublishTimeout, PublishTimeoutMin)
	c.Failf(o.MaxMessageSize < 1 || o.MaxMessageSize > MaxMessageSizeMax, "MaxMessageSize must be between 1 and %d bytes, got %d", MaxMessageSizeMax, o.MaxMessageSize)
	c.AtLeast("DialTimeout", o.DialTimeout, time.Millisecond)
	c.AtLeast("Heartbeat", o.Heartbeat, time.Second)
	c.Failf(o.ReconnectBackoff < time.Millisecond || o.ReconnectBackoffMax < o.ReconnectBackoff, "ReconnectBackoff (%v) must be at least 1ms and at most ReconnectBackoffMax (%v)", o.ReconnectBackoff, o.ReconnectBackoffMax)
	return c.Err()
}

// validateExchange checks an exchange name: 1 to 255 bytes of letters,
// digits, '-', '_', '.' and ':' (the characters AMQP 0-9-1 allows).
func validateExchange(name string) error {
	return optcheck.Name(name, MaxExchangeLen, "-_.:")
}
