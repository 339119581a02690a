package cli

import (
	"os"
	"strings"

	"github.com/spf13/pflag"

	"github.com/outboxrelay/outbox/internal/backends"
)

// brokerSecurityFlags are the TLS and credential flags of a command that
// opens a broker. Secrets may come from files (--nats-token-file, …) so
// that they need not sit in the environment or the process list.
type brokerSecurityFlags struct {
	tls backends.BrokerTLS

	natsCredsFile    string
	natsNkeyFile     string
	natsToken        string
	natsTokenFile    string
	natsUser         string
	natsPassword     string
	natsPasswordFile string

	kafkaMechanism    string
	kafkaUser         string
	kafkaPassword     string
	kafkaPasswordFile string

	amqpPasswordFile string
}

func (s *brokerSecurityFlags) add(fs *pflag.FlagSet) {
	fs.BoolVar(&s.tls.Enable, "broker-tls", false, "connect to the broker with TLS, verified against the system's CAs (implied by --broker-ca-file, tls:// and amqps://)")
	fs.StringVar(&s.tls.CAFile, "broker-ca-file", "", "PEM file of the CA(s) that sign the broker's TLS certificate")
	fs.StringVar(&s.tls.CertFile, "broker-cert-file", "", "PEM client certificate, for brokers that require mutual TLS (with --broker-key-file)")
	fs.StringVar(&s.tls.KeyFile, "broker-key-file", "", "PEM key of --broker-cert-file")

	fs.StringVar(&s.natsCredsFile, "nats-creds-file", "", "NATS credentials file (.creds: user JWT and nkey seed)")
	fs.StringVar(&s.natsNkeyFile, "nats-nkey-file", "", "file holding a NATS user nkey seed (SU…)")
	fs.StringVar(&s.natsToken, "nats-token", "", "NATS authentication token (prefer --nats-token-file)")
	fs.StringVar(&s.natsTokenFile, "nats-token-file", "", "file holding the NATS authentication token")
	fs.StringVar(&s.natsUser, "nats-user", "", "NATS user name (with --nats-password-file)")
	fs.StringVar(&s.natsPassword, "nats-password", "", "NATS password (prefer --nats-password-file)")
	fs.StringVar(&s.natsPasswordFile, "nats-password-file", "", "file holding the NATS password")

	fs.StringVar(&s.kafkaMechanism, "kafka-sasl-mechanism", "", "Kafka SASL mechanism: PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512")
	fs.StringVar(&s.kafkaUser, "kafka-sasl-user", "", "Kafka SASL user name")
	fs.StringVar(&s.kafkaPassword, "kafka-sasl-password", "", "Kafka SASL password (prefer --kafka-sasl-password-file)")
	fs.StringVar(&s.kafkaPasswordFile, "kafka-sasl-password-file", "", "file holding the Kafka SASL password")

	fs.StringVar(&s.amqpPasswordFile, "amqp-password-file", "", "file holding the RabbitMQ password of the user named in --broker (amqps://relay@host/)")

	markSecret(fs, "nats-token", "nats-password", "kafka-sasl-password")
}

// apply reads the secret files and puts the security options into o.
// Mistakes are usage errors naming the flag.
func (s *brokerSecurityFlags) apply(a *app, o *backends.BrokerOptions) error {
	o.TLS = s.tls
	var err error
	read := func(value *string, valueFlag, file, fileFlag string) {
		if err != nil || file == "" {
			return
		}
		if *value != "" {
			err = usagef("%s and %s are two ways to give one secret; give one of them", a.flagRef(valueFlag), a.flagRef(fileFlag))
			return
		}
		*value, err = readSecretFile(a, fileFlag, file)
	}
	token, natsPassword, kafkaPassword, amqpPassword := s.natsToken, s.natsPassword, s.kafkaPassword, ""
	read(&token, "nats-token", s.natsTokenFile, "nats-token-file")
	read(&natsPassword, "nats-password", s.natsPasswordFile, "nats-password-file")
	read(&kafkaPassword, "kafka-sasl-password", s.kafkaPasswordFile, "kafka-sasl-password-file")
	read(&amqpPassword, "amqp-password", s.amqpPasswordFile, "amqp-password-file")
	if err != nil {
		return err
	}
	o.NATS = backends.NATSAuth{CredsFile: s.natsCredsFile, NkeyFile: s.natsNkeyFile, Token: token, User: s.natsUser, Password: natsPassword,
		TokenFrom: secretFrom(a, "nats-token", s.natsTokenFile), PasswordFrom: secretFrom(a, "nats-password", s.natsPasswordFile)}
	o.Kafka = backends.KafkaSASL{Mechanism: strings.ToUpper(s.kafkaMechanism), User: s.kafkaUser, Password: kafkaPassword,
		PasswordFrom: secretFrom(a, "kafka-sasl-password", s.kafkaPasswordFile)}
	o.AMQP = backends.AMQPAuth{Password: amqpPassword}
	return nil
}

// secretFrom names the flag a secret came from: its -file flag when that
// was given, with where the value came from (a variable, the config file).
func secretFrom(a *app, valueFlag, file string) string {
	if file != "" {
		return a.flagRef(valueFlag + "-file")
	}
	return a.flagRef(valueFlag)
}

// readSecretFile reads a secret from a file, without its trailing newline.
func readSecretFile(a *app, flag, path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", usagef("%s: %v", a.flagRef(flag), err)
	}
	v := strings.TrimRight(string(b), "\r\n")
	if v == "" {
		return "", usagef("%s: %s is empty; put the secret in it", a.flagRef(flag), path)
	}
	if strings.ContainsAny(v, "\r\n") {
		return "", usagef("%s: %s has more than one line; put only the secret in it", a.flagRef(flag), path)
	}
	return v, nil
}
