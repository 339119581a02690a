package bench

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/outboxrelay/outbox"
	"github.com/outboxrelay/outbox/internal/servers"
)

// natsServerStartTimeout bounds how long the nats-server process may take
// to accept connections.
const natsServerStartTimeout = 15 * time.Second

// natsServerInstall is the command that installs the nats-server binary.
const natsServerInstall = "apt-get install nats-server"

// consumerName is the durable consumer the steady scenarios receive with.
const consumerName = "outbox-bench"

// embeddedNATSVersion is the version of the nats-server module the outbox
// binary embeds (`outbox demo`, `outbox bench broker-process`).
func embeddedNATSVersion() string { return "v" + server.VERSION }

// startNATSServer starts the `nats-server` binary on PATH as the bench's
// broker: a configuration file of the bench's own that sets only its
// address (127.0.0.1, a free port) and JetStream with a store directory
// (a new temporary directory, which the caller removes after stopping the
// process); everything else, the file store's sync interval included, is
// the server's default. It returns the process, its client URL, the
// directory and the server's version.
func startNATSServer(ctx context.Context, o Options) (_ *child, clientURL, dir, version string, err error) {
	exe, err := exec.LookPath("nats-server")
	if err != nil {
		return nil, "", "", "", fmt.Errorf("bench: no nats-server on PATH for the broker process: install it (%s), or pass --broker-process %s (the NATS server this binary embeds) or --broker nats://…", natsServerInstall, BrokerEmbedded)
	}
	version = "(version unknown)"
	if out, verr := exec.CommandContext(ctx, exe, "--version").Output(); verr == nil {
		// "nats-server: v2.9.10"
		f := strings.Fields(string(out))
		if len(f) > 0 {
			version = f[len(f)-1]
		}
	}
	port, err := servers.FreePort()
	if err != nil {
		return nil, "", "", "", err
	}
	dir, err = os.MkdirTemp("", "outbox-bench-nats-")
	if err != nil {
		return nil, "", "", "", fmt.Errorf("bench: broker process: %w", err)
	}
	defer func() {
		if err != nil {
			_ = os.RemoveAll(dir)
		}
	}()
	conf := filepath.Join(dir, "nats-server.conf")
	text := fmt.Sprintf("listen: \"127.0.0.1:%d\"\njetstream {\n  store_dir: %s\n}\n", port, strconv.Quote(filepath.Join(dir, "jetstream")))
	if err := os.WriteFile(conf, []byte(text), 0o600); err != nil {
		return nil, "", "", "", fmt.Errorf("bench: broker process: %w", err)
	}
	c, _, err := startProcess(ctx, o, "nats-server", exe, []string{"-c", conf}, nil)
	if err != nil {
		return nil, "", "", "", err
	}
	clientURL = "nats://127.0.0.1:" + strconv.Itoa(port)
	ready, cancel := context.WithTimeout(ctx, natsServerStartTimeout)
	defer cancel()
	err = pollUntil(ready, "wait for nats-server", func() (bool, int64, error) {
		if done, werr := c.exited(); done {
			return false, 0, fmt.Errorf("bench: nats-server exited at start (%v)%s", werr, c.lastWords())
		}
		nc, cerr := nats.Connect(clientURL, nats.Timeout(time.Second))
		if cerr != nil {
			return false, 0, nil
		}
		defer nc.Close()
		js, cerr := jetstream.New(nc)
		if cerr != nil {
			return false, 0, nil
		}
		_, cerr = js.AccountInfo(ready)
		return cerr == nil, 0, nil
	})
	if err != nil {
		_ = c.stop()
		return nil, "", "", "", fmt.Errorf("bench: nats-server at %s with JetStream did not come up within %v: %w%s", clientURL, natsServerStartTimeout, err, c.lastWords())
	}
	return c, clientURL, dir, version, nil
}

// brokerNotice says which broker process the bench starts without
// --broker.
func brokerNotice(o Options) string {
	if o.BrokerProcess == BrokerEmbedded {
		return "bench: no --broker given: starting a broker process (outbox bench broker-process: the embedded NATS server, JetStream file storage)"
	}
	return "bench: no --broker given: starting a broker process (nats-server from PATH, JetStream file storage in a temporary directory, default sync)"
}

// consumerText describes the consumer kind for the output.
func consumerText(kind string) string {
	if kind == ConsumerOrdered {
		return "an ordered (ephemeral) JetStream consumer"
	}
	return "a durable JetStream pull consumer, explicit acks"
}

// consumeSetupTimeout bounds creating the consumer.
const consumeSetupTimeout = 10 * time.Second

// consume receives the stream's messages with a JetStream consumer of
// kind (ConsumerDurable or ConsumerOrdered) on a connection of its own
// and calls got with each message's ID as it arrives (then acknowledges
// it, for a durable consumer), until stop.
func consume(url, stream, kind string, got func(id string)) (stop func(), err error) {
	nc, err := nats.Connect(url, nats.Name("outbox-bench-consumer"))
	if err != nil {
		return nil, fmt.Errorf("bench: connect the consumer: %w", err)
	}
	defer func() {
		if err != nil {
			nc.Close()
		}
	}()
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, fmt.Errorf("bench: %w", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), consumeSetupTimeout)
	defer cancel()
	var cons jetstream.Consumer
	switch kind {
	case ConsumerOrdered:
		cons, err = js.OrderedConsumer(ctx, stream, jetstream.OrderedConsumerConfig{})
	case ConsumerDurable:
		cons, err = js.CreateOrUpdateConsumer(ctx, stream, jetstream.ConsumerConfig{Durable: consumerName, AckPolicy: jetstream.AckExplicitPolicy})
	default:
		return nil, errors.New("bench: unknown consumer kind " + strconv.Quote(kind))
	}
	if err != nil {
		return nil, fmt.Errorf("bench: create the %s consumer on stream %s: %w", kind, stream, err)
	}
	cc, err := cons.Consume(func(m jetstream.Msg) {
		got(m.Headers().Get(outbox.HeaderID))
		if kind == ConsumerDurable {
			_ = m.Ack()
		}
	})
	if err != nil {
		return nil, fmt.Errorf("bench: consume stream %s: %w", stream, err)
	}
	return func() {
		cc.Stop()
		nc.Close()
	}, nil
}
