package cli_test

import (
	"crypto/tls"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"

	"github.com/outboxrelay/outbox/internal/testenv"
)

// secretFile writes a secret into a file of the test, as an operator
// would (with a trailing newline).
func secretFile(t *testing.T, name, secret string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(secret+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// relayPublishes runs `outbox relay` with args against a fresh outbox of 20
// messages on topic secure.test, waits until count reports them all at the
// broker, stops the relay, and checks that no output holds a secret.
func relayPublishes(t *testing.T, count func() uint64, secrets []string, args ...string) {
	t.Helper()
	relayPublishesEnv(t, nil, count, secrets, args...)
}

// relayPublishesEnv is relayPublishes with environment variables.
func relayPublishesEnv(t *testing.T, vars map[string]string, count func() uint64, secrets []string, args ...string) {
	t.Helper()
	const n = 20
	dsn := migrated(t, 4)
	write(t, dsn, messages("secure.test", n, 5))
	base := count()
	all := append([]string{"relay", "--store", dsn, "--http-addr", "127.0.0.1:0", "--log-level", "debug", "--poll-interval", "50ms"}, args...)
	b := start(t, vars, all...)
	poll(t, "the messages to reach the broker", func() bool {
		if code, done := b.exited(); done {
			t.Fatalf("relay exited %d:\n%s", code, b.stderr)
		}
		return count() >= base+n
	})
	if code := b.stop(t); code != 0 {
		t.Fatalf("relay exited %d:\n%s", code, b.stderr)
	}
	noSecret(t, b.stdout.String()+b.stderr.String(), secrets...)
}

// relayRefused runs `outbox relay` with args and checks that it fails at
// start-up with exit 1 and one line holding want, and no secret.
func relayRefused(t *testing.T, want string, secrets []string, args ...string) {
	t.Helper()
	dsn := migrated(t, 4)
	all := append([]string{"relay", "--store", dsn, "--http-addr", "", "--log-level", "debug"}, args...)
	r := run(t, nil, all...)
	lines := strings.Split(strings.TrimSpace(r.stderr), "\n")
	last := lines[len(lines)-1]
	if r.code != 1 || !strings.Contains(last, want) {
		t.Fatalf("want exit 1 with a last line holding %q; got %v", want, r)
	}
	if !strings.HasPrefix(last, "outbox relay: ") {
		t.Fatalf("the error is not one line of its own: %q", last)
	}
	noSecret(t, r.stdout+r.stderr, secrets...)
}

// noSecret fails if out holds any of the secrets.
func noSecret(t *testing.T, out string, secrets ...string) {
	t.Helper()
	for _, s := range secrets {
		if s != "" && strings.Contains(out, s) {
			t.Fatalf("the output shows the secret %q:\n%s", s, out)
		}
	}
}

// natsStream creates the stream of secure.> through a connection made with
// opts and returns a function counting its messages.
func natsStream(t *testing.T, url string, opts ...nats.Option) func() uint64 {
	t.Helper()
	nc, err := nats.Connect(url, opts...)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	st, err := js.CreateStream(t.Context(), jetstream.StreamConfig{Name: "SECURE", Subjects: []string{"secure.>"}})
	if err != nil {
		t.Fatalf("create stream: %v", err)
	}
	return func() uint64 {
		info, err := st.Info(t.Context())
		if err != nil {
			t.Fatalf("stream info: %v", err)
		}
		return info.State.Msgs
	}
}

func TestRelayNATSTLS(t *testing.T) {
	t.Parallel()
	pki := testenv.NewPKI(t, "nats")
	s := testenv.NATSWith(t, server.Options{TLSConfig: pki.ServerTLS(false), TLS: true})
	url := s.ClientURL() // tls://127.0.0.1:port
	count := natsStream(t, url, nats.RootCAs(pki.CAFile))

	t.Run("custom CA publishes", func(t *testing.T) {
		relayPublishes(t, count, nil, "--broker", url, "--broker-ca-file", pki.CAFile)
	})
	t.Run("system roots refused", func(t *testing.T) {
		relayRefused(t, "the broker's TLS certificate is not signed by a CA the system trusts; give its CA with --broker-ca-file", nil, "--broker", url)
	})
	t.Run("other CA refused", func(t *testing.T) {
		other := testenv.NewPKI(t, "other")
		relayRefused(t, "not signed by a CA in "+other.CAFile, nil, "--broker", url, "--broker-ca-file", other.CAFile)
	})
}

func TestRelayNATSMutualTLS(t *testing.T) {
	t.Parallel()
	pki := testenv.NewPKI(t, "nats")
	s := testenv.NATSWith(t, server.Options{TLSConfig: pki.ServerTLS(true), TLS: true, TLSVerify: true})
	url := s.ClientURL() // tls://127.0.0.1:port
	client := pki.Client("relay")
	count := natsStream(t, url, nats.RootCAs(pki.CAFile), nats.ClientCert(client.CertFile, client.KeyFile))

	t.Run("client certificate publishes", func(t *testing.T) {
		relayPublishes(t, count, nil, "--broker", url, "--broker-ca-file", pki.CAFile,
			"--broker-cert-file", client.CertFile, "--broker-key-file", client.KeyFile)
	})
	t.Run("no client certificate refused", func(t *testing.T) {
		relayRefused(t, "client certificate (mutual TLS)", nil, "--broker", url, "--broker-ca-file", pki.CAFile)
	})
	t.Run("foreign client certificate refused", func(t *testing.T) {
		foreign := testenv.NewPKI(t, "foreign").Client("relay")
		relayRefused(t, "refused the client certificate "+foreign.CertFile+" (--broker-cert-file)", nil, "--broker", url, "--broker-ca-file", pki.CAFile,
			"--broker-cert-file", foreign.CertFile, "--broker-key-file", foreign.KeyFile)
	})
}

func TestRelayNATSToken(t *testing.T) {
	t.Parallel()
	const token = "tok-9f3c1a7e5b2d4c68"
	s := testenv.NATSWith(t, server.Options{Authorization: token})
	count := natsStream(t, s.ClientURL(), nats.Token(token))
	hostPort := strings.TrimPrefix(s.ClientURL(), "nats://")
	const wrong = "tok-wrong-0c4e2b9a71d3"

	t.Run("token file publishes", func(t *testing.T) {
		relayPublishes(t, count, []string{token}, "--broker", s.ClientURL(), "--nats-token-file", secretFile(t, "token", token))
	})
	t.Run("token in the URL publishes", func(t *testing.T) {
		relayPublishes(t, count, []string{token}, "--broker", "nats://"+token+"@"+hostPort)
	})
	t.Run("wrong token refused", func(t *testing.T) {
		relayRefused(t, "the NATS server refused the token (--nats-token)", []string{wrong}, "--broker", s.ClientURL(), "--nats-token", wrong)
	})
	t.Run("wrong token in the URL refused", func(t *testing.T) {
		relayRefused(t, "the NATS server refused the credentials in --broker", []string{wrong}, "--broker", "nats://"+wrong+"@"+hostPort)
	})
	t.Run("no token refused", func(t *testing.T) {
		relayRefused(t, "the NATS server requires credentials; give --nats-creds-file, --nats-nkey-file, --nats-token-file or --nats-user", nil, "--broker", s.ClientURL())
	})
}

func TestRelayNATSUserPassword(t *testing.T) {
	t.Parallel()
	const password = "pw-5d1e8b3a9c7f2046"
	s := testenv.NATSWith(t, server.Options{Username: "relay", Password: password})
	count := natsStream(t, s.ClientURL(), nats.UserInfo("relay", password))
	t.Run("password file publishes", func(t *testing.T) {
		relayPublishes(t, count, []string{password}, "--broker", s.ClientURL(), "--nats-user", "relay", "--nats-password-file", secretFile(t, "pw", password))
	})
	t.Run("wrong password refused", func(t *testing.T) {
		const wrong = "pw-wrong-77ab01cd93ef"
		relayRefused(t, "the NATS server refused user relay and its password (--nats-user, --nats-password)", []string{wrong}, "--broker", s.ClientURL(), "--nats-user", "relay", "--nats-password", wrong)
	})
}

func TestRelayNATSNkey(t *testing.T) {
	t.Parallel()
	user, _ := nkeys.CreateUser()
	pub, _ := user.PublicKey()
	seed, _ := user.Seed()
	s := testenv.NATSWith(t, server.Options{Nkeys: []*server.NkeyUser{{Nkey: pub}}})
	seedFile := secretFile(t, "relay.nk", string(seed))
	opt, err := nats.NkeyOptionFromSeed(seedFile)
	if err != nil {
		t.Fatal(err)
	}
	count := natsStream(t, s.ClientURL(), opt)
	t.Run("seed file publishes", func(t *testing.T) {
		relayPublishes(t, count, []string{string(seed)}, "--broker", s.ClientURL(), "--nats-nkey-file", seedFile)
	})
	t.Run("unknown nkey refused", func(t *testing.T) {
		other, _ := nkeys.CreateUser()
		otherSeed, _ := other.Seed()
		f := secretFile(t, "other.nk", string(otherSeed))
		relayRefused(t, "the NATS server refused the nkey seed in "+f+" (--nats-nkey-file)", []string{string(otherSeed)}, "--broker", s.ClientURL(), "--nats-nkey-file", f)
	})
}

// natsAccount makes an operator, a system account and an account with
// JetStream, and returns the server options trusting them and a function
// issuing a .creds file for a user of the account.
func natsAccount(t *testing.T) (server.Options, func(name string) (credsFile, seed string)) {
	t.Helper()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	op, err := nkeys.CreateOperator()
	must(err)
	opPub, err := op.PublicKey()
	must(err)
	opClaims := jwt.NewOperatorClaims(opPub)
	resolver := &server.MemAccResolver{}
	account := func(js bool) nkeys.KeyPair {
		kp, err := nkeys.CreateAccount()
		must(err)
		pub, err := kp.PublicKey()
		must(err)
		c := jwt.NewAccountClaims(pub)
		if js {
			c.Limits.JetStreamLimits = jwt.JetStreamLimits{MemoryStorage: -1, DiskStorage: -1, Streams: -1, Consumer: -1}
		}
		tok, err := c.Encode(op)
		must(err)
		must(resolver.Store(pub, tok))
		return kp
	}
	sys := account(false)
	sysPub, err := sys.PublicKey()
	must(err)
	app := account(true)
	issue := func(name string) (string, string) {
		u, err := nkeys.CreateUser()
		must(err)
		pub, err := u.PublicKey()
		must(err)
		seed, err := u.Seed()
		must(err)
		c := jwt.NewUserClaims(pub)
		c.Name = name
		tok, err := c.Encode(app)
		must(err)
		creds, err := jwt.FormatUserConfig(tok, seed)
		must(err)
		p := filepath.Join(t.TempDir(), name+".creds")
		must(os.WriteFile(p, creds, 0o600))
		return p, string(seed)
	}
	return server.Options{
		TrustedOperators: []*jwt.OperatorClaims{opClaims},
		SystemAccount:    sysPub,
		AccountResolver:  resolver,
	}, issue
}

func TestRelayNATSCreds(t *testing.T) {
	t.Parallel()
	opts, issue := natsAccount(t)
	s := testenv.NATSWith(t, opts)
	admin, _ := issue("admin")
	count := natsStream(t, s.ClientURL(), nats.UserCredentials(admin))
	t.Run("creds file publishes", func(t *testing.T) {
		creds, seed := issue("relay")
		relayPublishes(t, count, []string{seed}, "--broker", s.ClientURL(), "--nats-creds-file", creds)
	})
	t.Run("creds of another operator refused", func(t *testing.T) {
		_, foreignIssue := natsAccount(t)
		creds, seed := foreignIssue("intruder")
		relayRefused(t, "the NATS server refused the credentials file "+creds+" (--nats-creds-file)", []string{seed}, "--broker", s.ClientURL(), "--nats-creds-file", creds)
	})
}

// clientTLS is a client tls.Config trusting pki, with cert if not nil.
func clientTLS(pki *testenv.PKI, cert *testenv.Cert) *tls.Config {
	cfg := &tls.Config{RootCAs: pki.Pool(), MinVersion: tls.VersionTLS12}
	if cert != nil {
		cfg.Certificates = []tls.Certificate{cert.TLS}
	}
	return cfg
}
