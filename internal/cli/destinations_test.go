package cli_test

import (
	"context"
	"encoding/json"
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

type destResult struct {
	Kind, Name, Action, Settings string
}

func createDestinations(t *testing.T, args ...string) []destResult {
	t.Helper()
	r := mustRun(t, nil, append([]string{"destinations", "create", "--json"}, args...)...)
	var out []destResult
	if err := json.Unmarshal([]byte(r.stdout), &out); err != nil {
		t.Fatalf("%v\n%s", err, r)
	}
	return out
}

// relayDrains runs a relay on a fresh outbox holding n messages of topic
// until done reports them arrived.
func relayDrains(t *testing.T, topic string, n int, done func() bool, args ...string) {
	t.Helper()
	dsn := migrated(t, 4)
	write(t, dsn, messages(topic, n, 3))
	b := start(t, nil, append([]string{"relay", "--store", dsn, "--http-addr", "", "--poll-interval", "50ms"}, args...)...)
	poll(t, "the messages to arrive", func() bool {
		if code, exited := b.exited(); exited {
			t.Fatalf("relay exited %d:\n%s", code, b.stderr)
		}
		return done()
	})
	if code := b.stop(t); code != 0 {
		t.Fatalf("relay exited %d:\n%s", code, b.stderr)
	}
	if strings.Contains(b.stderr.String(), "destination blocked") {
		t.Fatalf("a destination was blocked:\n%s", b.stderr)
	}
}

func TestDestinationsCreateNATS(t *testing.T) {
	t.Parallel()
	ns := testenv.NATS(t)
	stream := strings.ToUpper(testenv.Name(t))
	res := createDestinations(t, "--broker", ns.ClientURL(), "--subject-prefix", "app.", "--topic", "dest.>", "--stream", stream,
		"--stream-duplicate-window", "5m", "--stream-retention", "limits", "--stream-storage", "memory", "--stream-max-age", "24h")
	if len(res) != 1 || res[0].Action != "created" || res[0].Name != stream {
		t.Fatalf("first create: %+v", res)
	}
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
		s, err := js.Stream(context.Background(), stream)
		if err != nil {
			t.Fatal(err)
		}
		i, err := s.Info(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		return i
	}
	c := info().Config
	if strings.Join(c.Subjects, ",") != "app.dest.>" || c.Duplicates != 5*time.Minute || c.Storage != jetstream.MemoryStorage || c.MaxAge != 24*time.Hour || c.Replicas != 1 {
		t.Fatalf("stream config %+v", c)
	}
	// Again: it exists; with another topic: the subject is added.
	if res := createDestinations(t, "--broker", ns.ClientURL(), "--subject-prefix", "app.", "--topic", "dest.>", "--stream", stream); res[0].Action != "exists" {
		t.Fatalf("second create: %+v", res)
	}
	if res := createDestinations(t, "--broker", ns.ClientURL(), "--subject-prefix", "app.", "--topic", "other.*", "--stream", stream); res[0].Action != "updated" {
		t.Fatalf("create with a new topic: %+v", res)
	}
	if got := strings.Join(info().Config.Subjects, ","); got != "app.dest.>,app.other.*" {
		t.Fatalf("subjects after the update: %s", got)
	}
	relayDrains(t, "dest.created", 10, func() bool { return info().State.Msgs == 10 },
		"--broker", ns.ClientURL(), "--subject-prefix", "app.")
}

func TestDestinationsCreateKafka(t *testing.T) {
	t.Parallel()
	seeds, _ := testenv.Kafka(t)
	broker := "kafka://" + strings.Join(seeds, ",")
	res := createDestinations(t, "--broker", broker, "--topic", "dest.created,dest.paid", "--kafka-partitions", "3", "--kafka-replication-factor", "1")
	if len(res) != 2 || res[0].Action != "created" || res[1].Action != "created" {
		t.Fatalf("first create: %+v", res)
	}
	if res := createDestinations(t, "--broker", broker, "--topic", "dest.created"); res[0].Action != "exists" {
		t.Fatalf("second create: %+v", res)
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(seeds...))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	td, err := kadm.NewClient(cl).ListTopics(context.Background(), "dest.created", "dest.paid")
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"dest.created", "dest.paid"} {
		if d, ok := td[name]; !ok || len(d.Partitions) != 3 {
			t.Fatalf("topic %s: %+v", name, d)
		}
	}
	// The relay publishes to them (a missing topic fails permanently).
	relayDrains(t, "dest.created", 10, func() bool {
		offs, err := kadm.NewClient(cl).ListEndOffsets(context.Background(), "dest.created")
		if err != nil {
			return false
		}
		var n int64
		offs.Each(func(o kadm.ListedOffset) { n += o.Offset })
		return n == 10
	}, "--broker", broker)
}

func TestDestinationsCreateRabbitMQ(t *testing.T) {
	t.Parallel()
	base := testenv.RabbitMQ(t)
	name := testenv.Name(t)
	broker := base + "?exchange=" + name
	res := createDestinations(t, "--broker", broker, "--topic", "dest.#", "--queue", name+"-q", "--queue-type", "quorum")
	if len(res) != 3 || res[0].Kind != "exchange" || res[1].Kind != "queue" || res[2].Kind != "binding" || !strings.Contains(res[1].Settings, "quorum") {
		t.Fatalf("create: %+v", res)
	}
	createDestinations(t, "--broker", broker, "--topic", "dest.#", "--queue", name+"-q", "--queue-type", "quorum") // again: no error
	conn, err := amqp.Dial(base)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	relayDrains(t, "dest.created", 10, func() bool {
		q, err := ch.QueueDeclarePassive(name+"-q", true, false, false, false, amqp.Table{"x-queue-type": "quorum"})
		return err == nil && q.Messages == 10
	}, "--broker", broker)
	// A queue of that name with other settings: the error says so.
	r := run(t, nil, "destinations", "create", "--broker", broker, "--topic", "dest.#", "--queue", name+"-q", "--queue-type", "classic")
	if r.code != 1 || !strings.Contains(r.stderr, "give another --queue") {
		t.Fatalf("a conflicting queue: %v", r)
	}
}

func TestDestinationsCreateUsage(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"destinations", "create", "--topic", "a"}, "--broker is required"},
		{[]string{"destinations", "create", "--broker", "nats://127.0.0.1:1"}, "--topic"},
		{[]string{"destinations", "create", "--broker", "nats://127.0.0.1:1", "--topic", "a", "--stream-retention", "forever"}, "--stream-retention: must be limits, interest or workqueue"},
		{[]string{"destinations", "create", "--broker", "amqp://127.0.0.1:1/", "--topic", "a", "--queue-type", "stream"}, "--queue-type: must be classic or quorum"},
		{[]string{"destinations", "create", "--broker", "sqlite:///x", "--topic", "a"}, "unknown scheme"},
		{[]string{"destinations"}, "needs a subcommand: create"},
	} {
		r := run(t, nil, c.args...)
		if r.code != 2 || !strings.Contains(r.stderr, c.want) {
			t.Errorf("outbox %s: want exit 2 and %q: %v", strings.Join(c.args, " "), c.want, r)
		}
	}
}

// TestEveryDestinationBlockedIsVisible: a relay on a fresh NATS server (no
// stream) says so where an operator looks first: /readyz's detail (still
// 200: a restart creates nothing) and outbox_all_destinations_blocked, which
// the shipped alert uses; once the stream exists, both clear.
func TestEveryDestinationBlockedIsVisible(t *testing.T) {
	t.Parallel()
	ns := testenv.NATS(t)
	dsn := migrated(t, 4)
	write(t, dsn, messages("fresh.created", 5, 2))
	b := start(t, nil, "relay", "--store", dsn, "--broker", ns.ClientURL(), "--http-addr", "127.0.0.1:0", "--log-format", "json", "--poll-interval", "50ms")
	addr := httpAddrFromLog(t, b)
	poll(t, "/readyz to say every destination is blocked", func() bool {
		code, r := readyz(t, addr)
		all, _ := r["all_destinations_blocked"].(bool)
		detail, _ := r["detail"].(string)
		return code == 200 && all && strings.Contains(detail, "outbox destinations create")
	})
	fams, _ := scrape(t, addr)
	if v, ok := gauge(fams, "outbox_all_destinations_blocked", "", ""); !ok || v != 1 {
		t.Fatalf("outbox_all_destinations_blocked = %v (exported %v), want 1", v, ok)
	}
	createDestinations(t, "--broker", ns.ClientURL(), "--topic", "fresh.>", "--stream", strings.ToUpper(testenv.Name(t)))
	poll(t, "the destination to unblock", func() bool {
		fams, _ := scrape(t, addr)
		v, _ := gauge(fams, "outbox_all_destinations_blocked", "", "")
		return v == 0
	})
	if code := b.stop(t); code != 0 {
		t.Fatalf("relay exited %d:\n%s", code, b.stderr)
	}
}
