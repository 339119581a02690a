package cli_test

import (
	"strings"
	"testing"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"github.com/twmb/franz-go/pkg/sasl/plain"

	"github.com/outboxrelay/outbox/internal/testenv"
)

// kafkaCount returns a function counting the records of topic secure.test
// (one partition), read through a client made with opts.
func kafkaCount(t *testing.T, seeds []string, opts ...kgo.Opt) func() uint64 {
	t.Helper()
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(seeds...)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return func() uint64 {
		req := kmsg.NewPtrListOffsetsRequest()
		topic := kmsg.NewListOffsetsRequestTopic()
		topic.Topic = "secure.test"
		part := kmsg.NewListOffsetsRequestTopicPartition()
		part.Partition = 0
		part.Timestamp = -1 // the end offset
		topic.Partitions = append(topic.Partitions, part)
		req.Topics = append(req.Topics, topic)
		resp, err := req.RequestWith(t.Context(), cl)
		if err != nil {
			t.Fatalf("list offsets: %v", err)
		}
		for _, rt := range resp.Topics {
			for _, rp := range rt.Partitions {
				if rp.ErrorCode != 0 {
					t.Fatalf("list offsets: error code %d", rp.ErrorCode)
				}
				return uint64(rp.Offset)
			}
		}
		t.Fatal("list offsets: no partition in the answer")
		return 0
	}
}

func TestRelayKafkaSASLOverTLS(t *testing.T) {
	t.Parallel()
	const (
		plainPW = "plain-pw-6b0f2e91d4"
		s256PW  = "scram256-pw-3c8a71e5f0"
		s512PW  = "scram512-pw-94d2b7a6c1"
		wrongPW = "wrong-pw-1f5e9c3b80"
	)
	pki := testenv.NewPKI(t, "kafka")
	seeds, _ := testenv.Kafka(t,
		kfake.SeedTopics(1, "secure.test"),
		kfake.EnableSASL(),
		kfake.Superuser("PLAIN", "relay-plain", plainPW),
		kfake.Superuser("SCRAM-SHA-256", "relay-256", s256PW),
		kfake.Superuser("SCRAM-SHA-512", "relay-512", s512PW),
		kfake.TLS(pki.ServerTLS(false)),
	)
	count := kafkaCount(t, seeds, kgo.DialTLSConfig(clientTLS(pki, nil)), kgo.SASL(plain.Auth{User: "relay-plain", Pass: plainPW}.AsMechanism()))
	broker := "kafka://" + strings.Join(seeds, ",")
	secrets := []string{plainPW, s256PW, s512PW, wrongPW}

	t.Run("PLAIN with the password in a file", func(t *testing.T) {
		relayPublishes(t, count, secrets, "--broker", broker, "--broker-ca-file", pki.CAFile,
			"--kafka-sasl-mechanism", "PLAIN", "--kafka-sasl-user", "relay-plain", "--kafka-sasl-password-file", secretFile(t, "pw", plainPW))
	})
	t.Run("SCRAM-SHA-256 from the config file", func(t *testing.T) {
		cfg := writeConfig(t, "broker-ca-file: "+pki.CAFile+"\nkafka-sasl-mechanism: SCRAM-SHA-256\nkafka-sasl-user: relay-256\nkafka-sasl-password: "+s256PW+"\n")
		relayPublishes(t, count, secrets, "--broker", broker, "--config", cfg)
	})
	t.Run("SCRAM-SHA-512 from the environment", func(t *testing.T) {
		relayPublishesEnv(t, map[string]string{
			"OUTBOX_BROKER_CA_FILE":       pki.CAFile,
			"OUTBOX_KAFKA_SASL_MECHANISM": "scram-sha-512",
			"OUTBOX_KAFKA_SASL_USER":      "relay-512",
			"OUTBOX_KAFKA_SASL_PASSWORD":  s512PW,
		}, count, secrets, "--broker", broker)
	})
	t.Run("wrong password refused", func(t *testing.T) {
		relayRefused(t, "the Kafka brokers refused SASL SCRAM-SHA-256 for user relay-256 (--kafka-sasl-user, --kafka-sasl-password)", secrets,
			"--broker", broker, "--broker-ca-file", pki.CAFile,
			"--kafka-sasl-mechanism", "SCRAM-SHA-256", "--kafka-sasl-user", "relay-256", "--kafka-sasl-password", wrongPW)
	})
	t.Run("PLAIN password for a SCRAM user refused", func(t *testing.T) {
		relayRefused(t, "the Kafka brokers refused SASL PLAIN for user relay-512", secrets,
			"--broker", broker, "--broker-ca-file", pki.CAFile,
			"--kafka-sasl-mechanism", "PLAIN", "--kafka-sasl-user", "relay-512", "--kafka-sasl-password", s512PW)
	})
	t.Run("no SASL refused", func(t *testing.T) {
		relayRefused(t, "the Kafka brokers require SASL authentication; give --kafka-sasl-mechanism", secrets,
			"--broker", broker, "--broker-ca-file", pki.CAFile)
	})
	t.Run("unknown CA refused", func(t *testing.T) {
		relayRefused(t, "the broker's TLS certificate is not signed by a CA the system trusts; give its CA with --broker-ca-file", secrets,
			"--broker", broker, "--broker-tls", "--kafka-sasl-mechanism", "PLAIN", "--kafka-sasl-user", "relay-plain", "--kafka-sasl-password", plainPW)
	})
	t.Run("no TLS refused", func(t *testing.T) {
		relayRefused(t, "the Kafka brokers require TLS; give --broker-ca-file", secrets,
			"--broker", broker, "--kafka-sasl-mechanism", "PLAIN", "--kafka-sasl-user", "relay-plain", "--kafka-sasl-password", plainPW)
	})
	t.Run("credentials in the URL are a usage error naming the flags", func(t *testing.T) {
		r := run(t, nil, "relay", "--store", "postgres://localhost/x", "--broker", "kafka://relay-plain:"+plainPW+"@"+seeds[0])
		if r.code != 2 || !strings.Contains(r.stderr, "give them with --kafka-sasl-mechanism, --kafka-sasl-user and --kafka-sasl-password-file") {
			t.Fatalf("%v", r)
		}
		noSecret(t, r.stdout+r.stderr, secrets...)
	})
}

func TestRelayKafkaMutualTLS(t *testing.T) {
	t.Parallel()
	pki := testenv.NewPKI(t, "kafka")
	seeds, _ := testenv.Kafka(t, kfake.SeedTopics(1, "secure.test"), kfake.TLS(pki.ServerTLS(true)))
	client := pki.Client("relay")
	count := kafkaCount(t, seeds, kgo.DialTLSConfig(clientTLS(pki, &client)))
	broker := "kafka://" + strings.Join(seeds, ",")
	t.Run("client certificate publishes", func(t *testing.T) {
		relayPublishes(t, count, nil, "--broker", broker, "--broker-ca-file", pki.CAFile,
			"--broker-cert-file", client.CertFile, "--broker-key-file", client.KeyFile)
	})
	t.Run("no client certificate refused", func(t *testing.T) {
		relayRefused(t, "client certificate (mutual TLS)", nil,
			"--broker", broker, "--broker-ca-file", pki.CAFile)
	})
}
