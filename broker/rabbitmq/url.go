package rabbitmq

import (
	"fmt"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

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
	for name, vals := range q {
		if slices.Contains(driverParams, name) {
			continue
		}
		if !slices.Contains(URLParams, name) {
			return "", opts, fmt.Errorf("rabbitmq: URL %s: unknown query parameter %q; accepted: %s", redacted, name, strings.Join(append(slices.Clone(URLParams), driverParams...), ", "))
		}
		if len(vals) != 1 {
			return "", opts, fmt.Errorf("rabbitmq: URL %s: query parameter %q is given %d times; give it once", redacted, name, len(vals))
		}
		v := vals[0]
		bad := func(want string) error {
			return fmt.Errorf("rabbitmq: URL %s: query parameter %s=%q must be %s", redacted, name, v, want)
		}
		switch name {
		case "exchange":
			opts.Exchange = v
		case "connection_name":
			opts.ConnectionName = v
		case "passive_exchange", "transient", "allow_unroutable":
			b, err := strconv.ParseBool(v)
			if err != nil {
				return "", opts, bad("true or false")
			}
			switch name {
			case "passive_exchange":
				opts.PassiveExchange = b
			case "transient":
				opts.Transient = b
			default:
				opts.AllowUnroutable = b
			}
		case "channels", "max_in_flight", "max_message_size", "connection_timeout":
			n, err := strconv.Atoi(v)
			if err != nil || n < 1 {
				return "", opts, bad("a positive integer")
			}
			switch name {
			case "channels":
				opts.Channels = n
			case "max_in_flight":
				opts.MaxInFlight = n
			case "max_message_size":
				opts.MaxMessageSize = n
			default:
				opts.DialTimeout = time.Duration(n) * time.Millisecond
			}
		case "publish_timeout":
			d, err := time.ParseDuration(v)
			if err != nil || d <= 0 {
				return "", opts, bad("a positive duration such as 10s")
			}
			opts.PublishTimeout = d
		}
		q.Del(name)
	}
	u.RawQuery = q.Encode()
	return u.String(), opts, nil
}

// Validate reports whether o, with its defaults, is usable: the error
// Dial would return without connecting, naming the field.
func (o Options) Validate() error {
	return o.WithDefaults().validate()
}
