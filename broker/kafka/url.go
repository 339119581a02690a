package kafka

import (
	"fmt"
	"net"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/outboxrelay/outbox/internal/redact"
)

// DefaultPort is the port of a broker given without one.
const DefaultPort = 9092

// URLParams are the query parameters ParseURL reads into Options.
var URLParams = []string{
	"auto_create",          // AllowAutoTopicCreation (true/false)
	"delivery_timeout",     // DeliveryTimeout (a duration: 30s)
	"publish_timeout",      // PublishTimeout (a duration: 10s)
	"max_buffered_records", // MaxBufferedRecords
	"max_message_bytes",    // MaxMessageBytes
	"linger",               // Linger (a duration: 5ms)
	"client_id",            // ClientID
	"key_pipeline",         // KeyPipeline (1: one message per key per call)
}

// ParseURL reads a Kafka URL, kafka://host:port,host:port?auto_create=true,
// into Options: the comma-separated hosts are the seed Brokers (port
// DefaultPort when omitted) and the query parameters listed in URLParams set
// the matching fields. Credentials, a path and unknown parameters are
// errors (configure TLS and SASL with Options.ClientOptions). Errors name
// the parameter.
func ParseURL(raw string) (Options, error) {
	var opts Options
	scheme, rest, ok := strings.Cut(raw, "://")
	if !ok || scheme != "kafka" {
		return opts, fmt.Errorf("kafka: URL %q: want kafka://host:port[,host:port...][?param=value...]", redact.URL(raw))
	}
	hosts, rawQuery, _ := strings.Cut(rest, "?")
	if strings.Contains(hosts, "#") {
		return opts, fmt.Errorf("kafka: URL %q has a fragment; remove it", redact.URL(raw))
	}
	if strings.Contains(hosts, "@") {
		return opts, fmt.Errorf("kafka: URL %q has credentials, which are not supported in the URL; configure SASL in Options.ClientOptions", redact.URL(raw))
	}
	hosts = strings.TrimSuffix(hosts, "/")
	if strings.Contains(hosts, "/") {
		return opts, fmt.Errorf("kafka: URL %q has a path; give only hosts: kafka://host:port,host:port", raw)
	}
	if hosts == "" {
		return opts, fmt.Errorf("kafka: URL %q has no broker; give kafka://host:port[,host:port...]", raw)
	}
	for _, h := range strings.Split(hosts, ",") {
		if h == "" {
			return opts, fmt.Errorf("kafka: URL %q has an empty broker in its list", raw)
		}
		if _, _, err := net.SplitHostPort(h); err != nil {
			// No port (or a bare IPv6 address): use the default one.
			h = net.JoinHostPort(strings.Trim(h, "[]"), strconv.Itoa(DefaultPort))
		}
		opts.Brokers = append(opts.Brokers, h)
	}
	q, err := url.ParseQuery(rawQuery)
	if err != nil {
		return opts, fmt.Errorf("kafka: URL %q has a malformed query string: %v", raw, err)
	}
	for name, vals := range q {
		if !slices.Contains(URLParams, name) {
			return opts, fmt.Errorf("kafka: URL %q: unknown query parameter %q; accepted: %s", raw, name, strings.Join(URLParams, ", "))
		}
		if len(vals) != 1 {
			return opts, fmt.Errorf("kafka: URL %q: query parameter %q is given %d times; give it once", raw, name, len(vals))
		}
		v := vals[0]
		bad := func(want string) error {
			return fmt.Errorf("kafka: URL %q: query parameter %s=%q must be %s", raw, name, v, want)
		}
		switch name {
		case "auto_create":
			b, err := strconv.ParseBool(v)
			if err != nil {
				return opts, bad("true or false")
			}
			opts.AllowAutoTopicCreation = b
		case "delivery_timeout", "publish_timeout", "linger":
			d, err := time.ParseDuration(v)
			if err != nil || d < 0 {
				return opts, bad("a duration such as 10s")
			}
			switch name {
			case "delivery_timeout":
				opts.DeliveryTimeout = d
			case "publish_timeout":
				opts.PublishTimeout = d
			default:
				opts.Linger = d
			}
		case "max_buffered_records", "max_message_bytes", "key_pipeline":
			n, err := strconv.Atoi(v)
			if err != nil || n < 1 {
				return opts, bad("a positive integer")
			}
			switch name {
			case "max_buffered_records":
				opts.MaxBufferedRecords = n
			case "max_message_bytes":
				opts.MaxMessageBytes = n
			default:
				opts.KeyPipeline = n
			}
		case "client_id":
			opts.ClientID = v
		}
	}
	return opts, nil
}

// Validate reports whether o, with its defaults, is usable: the error Dial
// would return without connecting, naming the field.
func (o Options) Validate() error {
	return o.WithDefaults().validate()
}
