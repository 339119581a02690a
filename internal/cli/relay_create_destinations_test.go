package cli_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxrelay/outbox/internal/testenv"
)

// `outbox relay --create-destinations TOPICS` creates at start, on a fresh
// broker, what it publishes to (as `outbox destinations create` does) with
// the settings given, and then drains its outbox there: relayDrains fails
// on any "destination blocked" and on messages that never arrive.

func TestRelayCreateDestinationsNATS(t *testing.T) {
	t.Parallel()
	ns := testenv.NATS(t)
	name := strings.ToUpper(testenv.Name(t))
	nc, err := nats.Connect(ns.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	info := func() *jetstream.StreamInfo {
		s, err := js.Stream(context.Background(), name)
		if err != nil {
			return nil // not created yet
		}
		i, err := s.Info(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		return i
	}
	if info() != nil {
		t.Fatal("the stream exists before the relay starts")
	}
	// The topics from the configuration file, the settings from flags.
	cfg := writeConfig(t, "create-destinations: made.>\n")
	relayDrains(t, "made.created", 10, func() bool { i := info(); return i != nil && i.State.Msgs == 10 },
		"--broker", ns.ClientURL(), "--subject-prefix", "app.", "--config", cfg,
		"--stream", name, "--stream-duplicate-window", "5m", "--stream-storage", "memory")
	c := info().Config
	if strings.Join(c.Subjects, ",") != "app.made.>" || c.Duplicates != 5*time.Minute || c.Storage != jetstream.MemoryStorage {
		t.Fatalf("stream config %+v", c)
	}
	// A second relay finds the stream and leaves it as it is.
	relayDrains(t, "made.paid", 5, func() bool { i := info(); return i != nil && i.State.Msgs == 15 },
		"--broker", ns.ClientURL(), "--subject-prefix", "app.", "--create-destinations", "made.>", "--stream", name)
}

func TestRelayCreateDestinationsKafka(t *testing.T) {
	t.Parallel()
	seeds, _ := testenv.Kafka(t)
	broker := "kafka://" + strings.Join(seeds, ",")
	cl, err := kgo.NewClient(kgo.SeedBrokers(seeds...))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	adm := kadm.NewClient(cl)
	topic := testenv.Name(t) + ".created"
	// kfake does not create topics on produce: without the relay's
	// creation every message would fail.
	relayDrains(t, topic, 10, func() bool {
		offs, err := adm.ListEndOffsets(context.Background(), topic)
		if err != nil {
			return false
		}
		var n int64
		offs.Each(func(o kadm.ListedOffset) { n += max(o.Offset, 0) })
		return n == 10
	}, "--broker", broker, "--create-destinations", topic, "--kafka-partitions", "3", "--kafka-replication-factor", "1")
	td, err := adm.ListTopics(context.Background(), topic)
	if err != nil {
		t.Fatal(err)
	}
	if d, ok := td[topic]; !ok || len(d.Partitions) != 3 {
		t.Fatalf("topic %s: %+v", topic, d)
	}
}

func TestRelayCreateDestinationsRabbitMQ(t *testing.T) {
	t.Parallel()
	base := testenv.RabbitMQ(t)
	name := testenv.Name(t)
	conn, err := amqp.Dial(base)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	queued := func() int {
		ch, err := conn.Channel()
		if err != nil {
			t.Fatal(err)
		}
		defer ch.Close()
		q, err := ch.QueueDeclarePassive(name+"-q", true, false, false, false, amqp.Table{"x-queue-type": "quorum"})
		if err != nil {
			return -1 // not declared yet (the failed passive declare closed the channel)
		}
		return q.Messages
	}
	relayDrains(t, "made.created", 10, func() bool { return queued() == 10 },
		"--broker", base+"?exchange="+name, "--create-destinations", "made.#", "--queue", name+"-q", "--queue-type", "quorum")
}

// TestRelayCreateDestinationsUsage: a mistake in what to create is a usage
// error naming the setting, found before the relay publishes anything.
func TestRelayCreateDestinationsUsage(t *testing.T) {
	t.Parallel()
	ns := testenv.NATS(t)
	dsn := migrated(t, 2)
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--create-destinations", "bad topic"}, "--create-destinations: \"bad topic\""},
		{[]string{"--create-destinations", "a.>", "--stream-retention", "forever"}, "--stream-retention: must be limits, interest or workqueue"},
	} {
		args := append([]string{"relay", "--store", dsn, "--broker", ns.ClientURL(), "--http-addr", ""}, c.args...)
		r := run(t, nil, args...)
		if r.code != 2 || !strings.Contains(r.stderr, c.want) {
			t.Errorf("outbox %s: want exit 2 and %q: %v", strings.Join(args, " "), c.want, r)
		}
	}
}
