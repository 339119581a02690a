package kafka

import (
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"

	"github.com/outboxrelay/outbox/broker/internal/optcheck"
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
		return opts, fmt.Errorf("kafka: URL %q has a path; give only hosts: kafka://host:port,host:port", redact.URL(raw))
	}
	if hosts == "" {
		return opts, fmt.Errorf("kafka: URL %q has no broker; give kafka://host:port[,host:port...]", redact.URL(raw))
	}
	for _, h := range strings.Split(hosts, ",") {
		if h == "" {
			return opts, fmt.Errorf("kafka: URL %q has an empty broker in its list", redact.URL(raw))
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
	err = optcheck.Query(q, fmt.Sprintf("kafka: URL %q", redact.URL(raw)), URLParams, nil, func(p optcheck.Param) error {
		var err error
		switch p.Name {
		case "auto_create":
			opts.AllowAutoTopicCreation, err = p.Bool()
		case "delivery_timeout":
			opts.DeliveryTimeout, err = p.Duration()
		case "publish_timeout":
			opts.PublishTimeout, err = p.Duration()
		case "linger":
			opts.Linger, err = p.Duration()
		case "max_buffered_records":
			opts.MaxBufferedRecords, err = p.PositiveInt()
		case "max_message_bytes":
			opts.MaxMessageBytes, err = p.PositiveInt()
		case "key_pipeline":
			opts.KeyPipeline, err = p.PositiveInt()
		case "client_id":
			opts.ClientID = p.Value
		}
		return err
	})
	return opts, err
}

// Validate reports whether o, with its defaults, is usable: the error Dial
// would return without connecting, naming the field.
func (o Options) Validate() error {
	return o.WithDefaults().validate()
}
