package rabbitmq

import (
	"fmt"
	"net/url"
	"time"

	"github.com/outboxrelay/outbox/broker/internal/optcheck"
	"github.com/outboxrelay/outbox/internal/redact"
)

// URLParams are the query parameters ParseURL takes off an AMQP URL into
// Options.
var URLParams = []string{
	"exchange",           // Exchange
	"passive_exchange",   // PassiveExchange (true/false)
	"transient",          // Transient (true/false)
	"allow_unroutable",   // AllowUnroutable (true/false)
	"channels",           // Channels
	"max_in_flight",      // MaxInFlight
	"publish_timeout",    // PublishTimeout (a duration: 10s)
	"max_message_size",   // MaxMessageSize (bytes)
	"connection_name",    // ConnectionName
	"connection_timeout", // DialTimeout, in milliseconds (RabbitMQ's URI parameter)
}

// driverParams are the query parameters amqp091-go reads from the URL
// itself (https://www.rabbitmq.com/docs/uri-query-parameters); ParseURL
// leaves them in place.
var driverParams = []string{"heartbeat", "channel_max", "auth_mechanism", "certfile", "keyfile", "cacertfile", "server_name_indication"}

// ParseURL splits an AMQP URL with options, such as
// amqp://guest:guest@localhost:5672/?exchange=events&channels=8, into the
// URL for the connection and the Options given by the query parameters
// listed in URLParams. The parameters amqp091-go reads itself (heartbeat,
// channel_max, auth_mechanism, certfile, keyfile, cacertfile,
// server_name_indication) stay in the URL; any other parameter is an
// error. Errors name the parameter and never show the password.
func ParseURL(raw string) (amqpURL string, opts Options, err error) {
	redacted := redact.URL(raw)
	u, err := url.Parse(raw)
	if err != nil {
		if ue, ok := err.(*url.Error); ok {
			err = ue.Err // url.Error repeats the URL, password included
		}
		return "", opts, fmt.Errorf("rabbitmq: invalid URL %s: %v; want amqp://user:password@host:5672/vhost", redacted, err)
	}
	if u.Scheme != "amqp" && u.Scheme != "amqps" {
		return "", opts, fmt.Errorf("rabbitmq: URL %s: scheme must be amqp or amqps, got %q", redacted, u.Scheme)
	}
	if u.Host == "" {
		return "", opts, fmt.Errorf("rabbitmq: URL %s has no host; give a URL such as amqp://guest:guest@localhost:5672/", redacted)
	}
	q, err := url.ParseQuery(u.RawQuery)
	if err != nil {
		return "", opts, fmt.Errorf("rabbitmq: URL %s has a malformed query string: %v", redacted, err)
	}
	err = optcheck.Query(q, "rabbitmq: URL "+redacted, URLParams, driverParams, func(p optcheck.Param) error {
		var err error
		switch p.Name {
		case "exchange":
			opts.Exchange = p.Value
		case "connection_name":
			opts.ConnectionName = p.Value
		case "passive_exchange":
			opts.PassiveExchange, err = p.Bool()
		case "transient":
			opts.Transient, err = p.Bool()
		case "allow_unroutable":
			opts.AllowUnroutable, err = p.Bool()
		case "channels":
			opts.Channels, err = p.PositiveInt()
		case "max_in_flight":
			opts.MaxInFlight, err = p.PositiveInt()
		case "max_message_size":
			opts.MaxMessageSize, err = p.PositiveInt()
		case "connection_timeout":
			var ms int
			ms, err = p.PositiveInt()
			opts.DialTimeout = time.Duration(ms) * time.Millisecond
		case "publish_timeout":
			opts.PublishTimeout, err = p.PositiveDuration()
		}
		return err
	})
	if err != nil {
		return "", opts, err
	}
	for _, name := range URLParams {
		q.Del(name) // the driver's parameters stay
	}
	u.RawQuery = q.Encode()
	return u.String(), opts, nil
}

// Validate reports whether o, with its defaults, is usable: the error
// Dial would return without connecting, naming the field.
func (o Options) Validate() error {
	return o.WithDefaults().validate()
}
