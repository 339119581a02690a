package backends

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"net/url"
	"regexp"
	"strconv"
	"strings"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sasl"
	"github.com/twmb/franz-go/pkg/sasl/plain"
	"github.com/twmb/franz-go/pkg/sasl/scram"

	"github.com/outboxrelay/outbox"
	"github.com/outboxrelay/outbox/broker/kafka"
)

// Kafka broker: kafka://host:port,host:port (the seed brokers; port 9092
// when omitted), producing idempotently with acks=all, the message key as
// record key, such as kafka://127.0.0.1:9092,127.0.0.1:9093?auto_create=true.
//
// Credentials never sit in the URL: SASL (PLAIN, SCRAM-SHA-256,
// SCRAM-SHA-512) comes from BrokerOptions.Kafka and TLS from
// BrokerOptions.TLS.
//
// Query parameters (see kafka.ParseURL): auto_create (let the broker create
// missing topics; by default a missing topic fails permanently),
// delivery_timeout, max_buffered_records, max_message_bytes, linger,
// client_id; plus the outbox's own: prefix (put before every topic),
// max_in_flight (the client's buffered-records bound), ack_timeout (the
// publish timeout).
func init() { RegisterBroker("kafka", openKafka) }

func openKafka(ctx context.Context, u *url.URL, o BrokerOptions) (outbox.Publisher, error) {
	opts, err := kafka.ParseURL(u.String())
	if err != nil {
		return nil, Invalid(BrokerFlag, "%v", err)
	}
	if o.MaxInFlight != 0 {
		if opts.MaxBufferedRecords != 0 && opts.MaxBufferedRecords != o.MaxInFlight {
			return nil, Invalid(BrokerFlag, "max_buffered_records=%d conflicts with max in flight %d; give one of them", opts.MaxBufferedRecords, o.MaxInFlight)
		}
		opts.MaxBufferedRecords = o.MaxInFlight
	}
	if o.AckTimeout != 0 {
		opts.PublishTimeout = o.AckTimeout
	}
	if prefix := o.SubjectPrefix; prefix != "" {
		opts.TopicMapper = func(topic string) string { return prefix + topic }
	}
	opts.Logger = o.Logger
	opts.CloudEvents = o.CloudEvents
	if err := opts.Validate(); err != nil {
		return nil, Invalid(BrokerFlag, "%v", err)
	}
	tlsCfg, err := o.TLS.Config()
	if err != nil {
		return nil, err
	}
	if tlsCfg != nil {
		opts.ClientOptions = append(opts.ClientOptions, kgo.DialTLSConfig(tlsCfg))
	}
	if m := kafkaSASL(o.Kafka); m != nil {
		opts.ClientOptions = append(opts.ClientOptions, kgo.SASL(m))
	}
	p, err := kafka.Dial(ctx, opts)
	if err != nil {
		return nil, kafkaRefusal(err, o)
	}
	return p, nil
}

// kafkaSASL returns franz-go's mechanism for s, or nil without SASL.
func kafkaSASL(s KafkaSASL) sasl.Mechanism {
	switch s.Mechanism {
	case SASLPlain:
		return plain.Auth{User: s.User, Pass: s.Password}.AsMechanism()
	case SASLScramSHA256:
		return scram.Auth{User: s.User, Pass: s.Password}.AsSha256Mechanism()
	case SASLScramSHA512:
		return scram.Auth{User: s.User, Pass: s.Password}.AsSha512Mechanism()
	}
	return nil
}

// kafkaRefusal says which credentials or TLS setting the brokers refused.
func kafkaRefusal(err error, o BrokerOptions) error {
	switch {
	case errors.Is(err, kerr.SaslAuthenticationFailed), errors.Is(err, kerr.IllegalSaslState):
		if o.Kafka.Mechanism == "" {
			return fmt.Errorf("the Kafka brokers require SASL authentication; give --kafka-sasl-mechanism, --kafka-sasl-user and --kafka-sasl-password-file: %w", err)
		}
		return fmt.Errorf("the Kafka brokers refused SASL %s for user %s (--kafka-sasl-user, %s): %w", o.Kafka.Mechanism, o.Kafka.User, cmp.Or(o.Kafka.PasswordFrom, "--kafka-sasl-password"), err)
	case errors.Is(err, kerr.UnsupportedSaslMechanism):
		return fmt.Errorf("the Kafka brokers do not accept SASL %s (--kafka-sasl-mechanism): %w", o.Kafka.Mechanism, err)
	case strings.Contains(err.Error(), "is TLS missing?") && !o.TLS.enabled():
		return fmt.Errorf("the Kafka brokers require TLS; give --broker-ca-file (or --broker-tls for a certificate the system trusts): %w", err)
	case strings.Contains(err.Error(), "is SASL missing?") && o.Kafka.Mechanism == "":
		return fmt.Errorf("the Kafka brokers require SASL authentication; give --kafka-sasl-mechanism, --kafka-sasl-user and --kafka-sasl-password-file: %w", err)
	case o.Kafka.Mechanism != "" && (errors.Is(err, io.EOF) || strings.Contains(err.Error(), "closed the connection")):
		// Some brokers close the connection on failed authentication
		// instead of answering SASL_AUTHENTICATION_FAILED.
		return fmt.Errorf("the Kafka brokers refused SASL %s for user %s (--kafka-sasl-user, %s): they closed the connection during authentication: %w", o.Kafka.Mechanism, o.Kafka.User, cmp.Or(o.Kafka.PasswordFrom, "--kafka-sasl-password"), err)
	}
	if why := notKafka(err); why != "" {
		return fmt.Errorf("%s: %w", why, err)
	}
	if why := tlsRefusal(err, o.TLS); why != "" {
		return fmt.Errorf("%s: %w", why, err)
	}
	return err
}

// largeSizeRe finds the response size franz-go complains about when the
// server at the other end does not speak Kafka: its first four bytes.
var largeSizeRe = regexp.MustCompile(`invalid large response size (\d+)`)

// notKafka says what answered instead of a Kafka broker, from the first
// four bytes it sent ("INFO": a NATS server), or "" when err is not that.
func notKafka(err error) string {
	m := largeSizeRe.FindStringSubmatch(err.Error())
	if m == nil || strings.Contains(err.Error(), "tls alert") {
		return ""
	}
	n, perr := strconv.ParseUint(m[1], 10, 32)
	if perr != nil {
		return ""
	}
	b := []byte{byte(n >> 24), byte(n >> 16), byte(n >> 8), byte(n)}
	what := "a server that does not speak Kafka"
	printable := true
	for _, c := range b {
		printable = printable && c >= 0x20 && c < 0x7f
	}
	if printable {
		what = fmt.Sprintf("a server that does not speak Kafka (it began with %q", b)
		switch string(b) {
		case "INFO":
			what += ": a NATS server, use nats://"
		case "AMQP":
			what += ": RabbitMQ, use amqp://"
		case "HTTP":
			what += ": an HTTP server"
		}
		what += ")"
	}
	return "the host and port in --broker are " + what + "; give the address of a Kafka broker (port 9092 by default)"
}
