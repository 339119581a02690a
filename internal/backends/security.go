package backends

import (
	"cmp"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"strings"
	"syscall"

	"github.com/outboxrelay/outbox/internal/redact"
)

// Flag names of the broker security options, used in errors.
const (
	BrokerTLSFlag      = "--broker-tls"
	BrokerCAFileFlag   = "--broker-ca-file"
	BrokerCertFileFlag = "--broker-cert-file"
	BrokerKeyFileFlag  = "--broker-key-file"
)

// BrokerTLS configures TLS to the broker: a custom CA and, for mutual TLS, a
// client certificate. Files hold PEM.
type BrokerTLS struct {
	// Enable turns TLS on with the system's roots (it is on as well when any
	// file is given, and for tls:// and amqps:// URLs).
	Enable bool
	// CAFile holds the certificates that may sign the broker's certificate,
	// instead of the system's roots.
	CAFile string
	// CertFile and KeyFile are the client certificate and its key, for
	// brokers that require mutual TLS. Give both or neither.
	CertFile, KeyFile string
}

func (t BrokerTLS) enabled() bool {
	return t.Enable || t.CAFile != "" || t.CertFile != "" || t.KeyFile != ""
}

// Config returns the *tls.Config of t, or nil when TLS is off. Errors name
// the flag of the file that cannot be used; they are *ConfigError.
func (t BrokerTLS) Config() (*tls.Config, error) {
	if !t.enabled() {
		return nil, nil
	}
	if (t.CertFile == "") != (t.KeyFile == "") {
		return nil, Invalid(BrokerCertFileFlag, "and %s go together: give both the client certificate and its key, or neither", BrokerKeyFileFlag)
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if t.CAFile != "" {
		pem, err := os.ReadFile(t.CAFile)
		if err != nil {
			return nil, Invalid(BrokerCAFileFlag, "%v", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, Invalid(BrokerCAFileFlag, "%s holds no PEM certificate; give the CA certificate(s) that signed the broker's", t.CAFile)
		}
		cfg.RootCAs = pool
	}
	if t.CertFile != "" {
		cert, err := tls.LoadX509KeyPair(t.CertFile, t.KeyFile)
		if err != nil {
			return nil, Invalid(BrokerCertFileFlag, "cannot load the client certificate %s with key %s: %v", t.CertFile, t.KeyFile, err)
		}
		cfg.Certificates = []tls.Certificate{cert}
	}
	return cfg, nil
}

// NATSAuth are the credentials for a NATS server; give at most one way.
type NATSAuth struct {
	CredsFile string // a .creds file: user JWT and nkey seed (--nats-creds-file)
	NkeyFile  string // a file with an nkey seed (SU…) (--nats-nkey-file)
	Token     string // (--nats-token, --nats-token-file)
	User      string // with Password (--nats-user)
	Password  string // (--nats-password, --nats-password-file)
	// TokenFrom and PasswordFrom name the flag the token and the password
	// came from, for errors (default --nats-token, --nats-password).
	TokenFrom, PasswordFrom string
}

func (a NATSAuth) set() []string {
	return flagsGiven(a.CredsFile, "--nats-creds-file", a.NkeyFile, "--nats-nkey-file", a.Token, "--nats-token",
		a.User, "--nats-user", a.Password, "--nats-password")
}

// describe names the credentials used, for an error saying they were
// refused; never the secret itself.
func (a NATSAuth) describe() string {
	switch {
	case a.CredsFile != "":
		return "the credentials file " + a.CredsFile + " (--nats-creds-file)"
	case a.NkeyFile != "":
		return "the nkey seed in " + a.NkeyFile + " (--nats-nkey-file)"
	case a.Token != "":
		return "the token (" + cmp.Or(a.TokenFrom, "--nats-token") + ")"
	case a.User != "":
		return "user " + a.User + " and its password (--nats-user, " + cmp.Or(a.PasswordFrom, "--nats-password") + ")"
	}
	return "no credentials"
}

// Kafka SASL mechanisms.
const (
	SASLPlain       = "PLAIN"
	SASLScramSHA256 = "SCRAM-SHA-256"
	SASLScramSHA512 = "SCRAM-SHA-512"
)

// KafkaSASL are SASL credentials for Kafka.
type KafkaSASL struct {
	Mechanism string // PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512 (--kafka-sasl-mechanism)
	User      string // (--kafka-sasl-user)
	Password  string // (--kafka-sasl-password, --kafka-sasl-password-file)
	// PasswordFrom names the flag the password came from, for errors
	// (default --kafka-sasl-password).
	PasswordFrom string
}

func (s KafkaSASL) set() []string {
	return flagsGiven(s.Mechanism, "--kafka-sasl-mechanism", s.User, "--kafka-sasl-user", s.Password, "--kafka-sasl-password")
}

// AMQPAuth are credentials for RabbitMQ beyond the URL's.
type AMQPAuth struct {
	// Password replaces the URL's password, so that it need not sit in the
	// URL (--amqp-password-file).
	Password string
}

// checkSecurity checks that only the options of the URL's broker are given
// and that they fit together.
func (o BrokerOptions) checkSecurity(u *url.URL) error {
	scheme := u.Scheme
	other := func(flags []string, want string) error {
		if len(flags) == 0 {
			return nil
		}
		return Invalid(flags[0], "applies to %s brokers only, but --broker is %s://; remove it", want, scheme)
	}
	isNATS := scheme == "nats" || scheme == "tls"
	isKafka := scheme == "kafka"
	isAMQP := scheme == "amqp" || scheme == "amqps"
	if !isNATS {
		if err := other(o.NATS.set(), "nats:// and tls://"); err != nil {
			return err
		}
	}
	if !isKafka {
		if err := other(o.Kafka.set(), "kafka://"); err != nil {
			return err
		}
	}
	if !isAMQP && o.AMQP.Password != "" {
		return other([]string{"--amqp-password-file"}, "amqp:// and amqps://")
	}
	if isAMQP && o.TLS.enabled() && scheme != "amqps" {
		return Invalid(BrokerFlag, "uses amqp://, but TLS options are given (%s); use amqps:// for TLS", strings.Join(o.TLS.given(), ", "))
	}
	if isKafka && (u.User != nil || strings.Contains(u.Host, "@")) {
		return Invalid(BrokerFlag, "%q holds credentials, which a Kafka URL cannot carry; give them with --kafka-sasl-mechanism, --kafka-sasl-user and --kafka-sasl-password-file (or the kafka-sasl-* keys of the --config file, or OUTBOX_KAFKA_SASL_* variables)", redact.URL(u.String()))
	}
	if isNATS {
		set := o.NATS.set()
		if o.NATS.User != "" || o.NATS.Password != "" {
			if o.NATS.User == "" || o.NATS.Password == "" {
				return Invalid("--nats-user", "and --nats-password (or --nats-password-file) go together; give both")
			}
			set = set[:len(set)-1] // user and password are one way
		}
		if len(set) > 1 {
			return Invalid(set[0], "and %s are two ways to authenticate; give one of them", strings.Join(set[1:], ", "))
		}
	}
	if isKafka && len(o.Kafka.set()) > 0 {
		switch o.Kafka.Mechanism {
		case SASLPlain, SASLScramSHA256, SASLScramSHA512:
		case "":
			return Invalid("--kafka-sasl-mechanism", "is required with SASL credentials: give PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512")
		default:
			return Invalid("--kafka-sasl-mechanism", "must be PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512, got %q", o.Kafka.Mechanism)
		}
		if o.Kafka.User == "" || o.Kafka.Password == "" {
			return Invalid("--kafka-sasl-user", "and --kafka-sasl-password (or --kafka-sasl-password-file) are required with --kafka-sasl-mechanism %s", o.Kafka.Mechanism)
		}
	}
	_, err := o.TLS.Config()
	return err
}

// given lists the TLS flags set.
func (t BrokerTLS) given() []string {
	enable := ""
	if t.Enable {
		enable = "true"
	}
	return flagsGiven(enable, BrokerTLSFlag, t.CAFile, BrokerCAFileFlag, t.CertFile, BrokerCertFileFlag, t.KeyFile, BrokerKeyFileFlag)
}

// flagsGiven takes pairs of a value and its flag and returns the flags
// whose values are not empty, in order.
func flagsGiven(valueFlagPairs ...string) []string {
	var out []string
	for i := 0; i+1 < len(valueFlagPairs); i += 2 {
		if valueFlagPairs[i] != "" {
			out = append(out, valueFlagPairs[i+1])
		}
	}
	return out
}

// tlsRefusal explains a TLS handshake failure in terms of the flags, or
// returns "" when err is not one.
func tlsRefusal(err error, t BrokerTLS) string {
	var unknownAuthority x509.UnknownAuthorityError
	var hostname x509.HostnameError
	var invalid x509.CertificateInvalidError
	var verify *tls.CertificateVerificationError
	msg := err.Error()
	switch {
	case errors.As(err, &unknownAuthority), errors.As(err, &verify) && errors.As(verify.Err, &unknownAuthority):
		if t.CAFile != "" {
			return fmt.Sprintf("the broker's TLS certificate is not signed by a CA in %s (%s)", t.CAFile, BrokerCAFileFlag)
		}
		return fmt.Sprintf("the broker's TLS certificate is not signed by a CA the system trusts; give its CA with %s", BrokerCAFileFlag)
	case errors.As(err, &hostname):
		return "the broker's TLS certificate is not valid for the host in --broker"
	case errors.As(err, &invalid):
		return "the broker's TLS certificate is invalid (" + invalid.Error() + ")"
	case strings.Contains(msg, "certificate required") || strings.Contains(msg, "bad certificate") || strings.Contains(msg, "unknown certificate authority"):
		if t.CertFile == "" {
			return fmt.Sprintf("the broker requires a client certificate (mutual TLS); give %s and %s", BrokerCertFileFlag, BrokerKeyFileFlag)
		}
		return fmt.Sprintf("the broker refused the client certificate %s (%s)", t.CertFile, BrokerCertFileFlag)
	case t.enabled() && (errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE) || errors.Is(err, io.EOF) ||
		strings.Contains(msg, "closed by remote after TLS handshake") ||
		// The same, seen through a client that keeps only the text (AMQP:
		// the reset, or the connection found closed during its handshake).
		strings.Contains(msg, "connection reset by peer") || strings.Contains(msg, "broken pipe") ||
		strings.Contains(msg, "channel/connection is not open")):
		// With TLS 1.3 the server checks the client certificate after the
		// handshake: the client may see the alert, or only a connection
		// closed or reset by the server.
		if t.CertFile == "" {
			return fmt.Sprintf("the broker closed the TLS connection after the handshake: it requires a client certificate (mutual TLS), most likely; give %s and %s", BrokerCertFileFlag, BrokerKeyFileFlag)
		}
		return fmt.Sprintf("the broker closed the TLS connection after the handshake: it refused the client certificate %s (%s), most likely", t.CertFile, BrokerCertFileFlag)
	case strings.Contains(msg, "first record does not look like a TLS handshake"):
		return "the broker does not speak TLS on that port; remove the TLS options or use the TLS port"
	}
	return ""
}
