package cli_test

import (
	"strings"
	"testing"
)

// TestNoSecretWhateverTheURL gives the command the URLs of issue 23, whose
// secrets an earlier redactor showed (a password in the query holding '@',
// a password holding ',', key/value strings with tabs and quotes, tokens in
// NATS lists, a '#' in a password), and checks --print-config, the usage
// errors and the connection errors. Each secret is two planted halves
// around the character that fooled the redactor, and neither half may show.
func TestNoSecretWhateverTheURL(t *testing.T) {
	t.Parallel()
	type tc struct {
		store, broker string
		secrets       []string
	}
	cases := []tc{
		{store: "postgres://127.0.0.1:1/app?connect_timeout=1&password=PLANTa1@PLANTa2", secrets: []string{"PLANTa1", "PLANTa2"}},
		{store: "postgres://app:PLANTb1,PLANTb2@127.0.0.1:1/app?connect_timeout=1", secrets: []string{"PLANTb1", "PLANTb2"}},
		{store: "postgres://app:PLANTc1@PLANTc2@127.0.0.1:1/app?connect_timeout=1", secrets: []string{"PLANTc1", "PLANTc2"}},
		{store: "postgres://app@127.0.0.1:1/app?connect_timeout=1&pass%77ord=PLANTd1", secrets: []string{"PLANTd1"}},
		{store: "host=127.0.0.1\tport=1\tpassword=PLANTe1\tdbname=app", secrets: []string{"PLANTe1"}},
		{store: "host=127.0.0.1 password = 'PLANTf1 PLANTf2' dbname=app", secrets: []string{"PLANTf1", "PLANTf2"}},
		{store: "postgres://app:PLANTg1#PLANTg2@127.0.0.1:1/app", secrets: []string{"PLANTg1", "PLANTg2"}},
		{store: "postgres://app:PLANTh1@127.0.0.1:1/app?sslmode=bogus", secrets: []string{"PLANTh1"}},
		{broker: "nats://PLANTi1,PLANTi2@127.0.0.1:1", secrets: []string{"PLANTi1", "PLANTi2"}},
		{broker: "nats://127.0.0.1:1, nats://u:PLANTj1@127.0.0.1:2,PLANTj2@127.0.0.1:3", secrets: []string{"PLANTj1", "PLANTj2"}},
		{broker: "amqp://guest:PLANTk1,PLANTk2@127.0.0.1:1/", secrets: []string{"PLANTk1", "PLANTk2"}},
		{broker: "amqp://guest:PLANTl1?PLANTl2@127.0.0.1:1/", secrets: []string{"PLANTl1", "PLANTl2"}},
		{broker: "kafka://u:PLANTm1@127.0.0.1:1/x", secrets: []string{"PLANTm1"}},
		{broker: "tls://PLANTn1@127.0.0.1:1#PLANTn2", secrets: []string{"PLANTn1", "PLANTn2"}},
	}
	for _, c := range cases {
		store, broker := c.store, c.broker
		if store == "" {
			store = "postgres://app@127.0.0.1:1/app?connect_timeout=1"
		}
		if broker == "" {
			broker = "nats://127.0.0.1:1"
		}
		var out strings.Builder
		r := run(t, nil, "relay", "--print-config", "--store", store, "--broker", broker)
		out.WriteString(r.stdout + r.stderr)
		if r.code == 0 && !strings.Contains(r.stdout, "xxxxx") {
			t.Errorf("--print-config of %q, %q shows no mask:\n%s", store, broker, r.stdout)
		}
		for _, args := range [][]string{
			{"relay", "--store", store, "--broker", broker, "--log-level", "debug"},
			{"status", "--store", store},
			{"dlq", "list", "--store", store},
			{"migrate", "--store", store},
		} {
			r := run(t, nil, args...)
			if r.code == 0 {
				t.Fatalf("outbox %s succeeded against unreachable servers", strings.Join(args, " "))
			}
			out.WriteString(r.stdout + r.stderr)
		}
		noSecret(t, out.String(), c.secrets...)
	}
}
