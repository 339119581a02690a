package e2e

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/jackc/pgx/v5"

	"github.com/outboxrelay/outbox"
	"github.com/outboxrelay/outbox/brokertest"
	"github.com/outboxrelay/outbox/internal/backends"
	"github.com/outboxrelay/outbox/internal/relaytest"
	"github.com/outboxrelay/outbox/internal/testenv"
	"github.com/outboxrelay/outbox/store/postgres"
)

// Operator mistakes against the real brokers (issue 11): a destination the
// broker refuses as a whole must cost no attempt and dead-letter nothing,
// even with MaxAttempts 1, and once the operator fixes it every message
// arrives, first deliveries in per-key commit order.

// mistakeRelay starts a relay on e's store publishing to url with
// MaxAttempts 1: any attempt spent on a blocked destination would
// dead-letter a message.
func mistakeRelay(t *testing.T, e *env, url string, maxAttempts int) *outbox.Relay {
	t.Helper()
	pub, err := backends.OpenPublisher(context.Background(), url, backends.BrokerOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pub.Close() })
	return relaytest.Start(t, e.store, pub, outbox.Config{
		Node: "mistakes", Workers: 2, BatchSize: 100,
		PollInterval: 20 * time.Millisecond, PublishTimeout: 2 * time.Second, LeaseTTL: 10 * time.Second,
		MaxAttempts: maxAttempts, BackoffMin: 5 * time.Millisecond, BackoffMax: 20 * time.Millisecond,
	})
}

// writeSome writes n messages over keys keys on topic, in transactions of
// up to 10, recording them in the checker.
func writeSome(t *testing.T, e *env, c *brokertest.Checker, topic string, n, keys int) {
	t.Helper()
	w := &writer{e: e, checker: c}
	w.runTopic(t, topic, keys, n)
}

// runTopic is run with a fixed topic.
func (w *writer) runTopic(t *testing.T, topic string, keys, total int) {
	ctx := context.Background()
	for n := 0; n < total; {
		size := min(10, total-n)
		msgs := make([]outbox.Message, size)
		for i := range msgs {
			msgs[i] = outbox.Message{ID: outbox.NewID(), Topic: topic, Key: fmt.Sprintf("k%d", (n+i)%keys), Payload: []byte(strconv.Itoa(n + i))}
		}
		if err := pgx.BeginFunc(ctx, w.e.store.Pool(), func(tx pgx.Tx) error { return postgres.Write(ctx, tx, msgs...) }); err != nil {
			t.Fatalf("write: %v", err)
		}
		for _, m := range msgs {
			w.checker.Written(m.Key, m.ID)
		}
		n += size
	}
}

// noDeadLetters fails the test if the outbox dead-lettered anything.
func noDeadLetters(t *testing.T, e *env, r *outbox.Relay) {
	t.Helper()
	dead, err := e.store.DeadLetters(context.Background(), outbox.DeadLetterFilter{})
	if err != nil {
		t.Fatal(err)
	}
	if len(dead) != 0 {
		t.Fatalf("%d messages dead-lettered (first: %s); a blocked destination must spend no attempt", len(dead), dead[0].LastError)
	}
	if s := r.Stats(); s.DeadLettered != 0 {
		t.Fatalf("relay stats %+v: dead letters", s)
	}
}

// restartableNATS is an embedded JetStream server that can be stopped and
// started again on the same port with the same storage.
type restartableNATS struct {
	t    *testing.T
	opts server.Options
	s    *server.Server
}

func newRestartableNATS(t *testing.T) *restartableNATS {
	port, err := testenv.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	n := &restartableNATS{t: t, opts: server.Options{
		ServerName: "outbox-" + testenv.Name(t), Host: "127.0.0.1", Port: port,
		JetStream: true, StoreDir: t.TempDir(), NoLog: true, NoSigs: true,
	}}
	n.start()
	t.Cleanup(n.stop)
	return n
}

func (n *restartableNATS) start() {
	opts := n.opts
	s, err := server.NewServer(&opts)
	if err != nil {
		n.t.Fatal(err)
	}
	s.Start()
	if !s.ReadyForConnections(10 * time.Second) {
		n.t.Fatal("nats: not ready within 10s")
	}
	n.s = s
}

func (n *restartableNATS) stop() {
	if n.s != nil {
		n.s.Shutdown()
		n.s.WaitForShutdown()
		n.s = nil
	}
}

func (n *restartableNATS) url() string { return fmt.Sprintf("nats://127.0.0.1:%d", n.opts.Port) }

func jetStream(t *testing.T, url string) jetstream.JetStream {
	nc, err := nats.Connect(url, nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return js
}

// natsMistake sets up a store and a restartable JetStream server with
// stream cfg.
func natsMistake(t *testing.T, cfg jetstream.StreamConfig) (*env, *restartableNATS, jetstream.JetStream) {
	t.Helper()
	e := setupWith(t, 8, func(t *testing.T) *target { return &target{name: "nats"} })
	ns := newRestartableNATS(t)
	js := jetStream(t, ns.url())
	if _, err := js.CreateStream(context.Background(), cfg); err != nil {
		t.Fatal(err)
	}
	return e, ns, js
}

var mistakeStream = jetstream.StreamConfig{Name: "MISTAKE", Subjects: []string{"e2e.>"}, Storage: jetstream.FileStorage, Duplicates: 10 * time.Minute}

// A stream deleted mid-run and recreated 10 s later: the messages written
// meanwhile wait, none is dead-lettered, and all arrive in key order.
func TestMistakeNATSStreamDeletedAndRecreated(t *testing.T) {
	t.Parallel()
	e, ns, js := natsMistake(t, mistakeStream)
	ctx := context.Background()
	r := mistakeRelay(t, e, ns.url(), 1)
	before := brokertest.NewChecker()
	writeSome(t, e, before, "e2e.a", 200, 20)
	waitFor(t, "the first messages published", time.Minute, func() bool { return outstanding(t, e) == 0 })
	if err := js.DeleteStream(ctx, mistakeStream.Name); err != nil {
		t.Fatal(err)
	}
	c := brokertest.NewChecker()
	writeSome(t, e, c, "e2e.a", 500, 20)
	waitFor(t, "the destination reported blocked", time.Minute, func() bool { return len(r.Blocked()) == 1 })
	time.Sleep(10 * time.Second) // the operator notices after 10 s (the scenario, not a synchronisation)
	noDeadLetters(t, e, r)
	if _, err := js.CreateStream(ctx, mistakeStream); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the outbox to drain after the stream came back", time.Minute, func() bool { return outstanding(t, e) == 0 })
	verify(t, &env{target: &target{name: "nats", read: func(t *testing.T, c *brokertest.Checker) int { return readStream(t, js, mistakeStream.Name, c) }}}, c)
	noDeadLetters(t, e, r)
	waitFor(t, "unblocked", time.Minute, func() bool { return len(r.Blocked()) == 0 })
}

// A stream at max_msgs with discard=new refuses new messages; when the
// operator raises the limit, everything arrives, nothing dead-lettered.
func TestMistakeNATSStreamFull(t *testing.T) {
	t.Parallel()
	cfg := mistakeStream
	cfg.MaxMsgs, cfg.Discard = 100, jetstream.DiscardNew
	e, ns, js := natsMistake(t, cfg)
	ctx := context.Background()
	r := mistakeRelay(t, e, ns.url(), 1)
	c := brokertest.NewChecker()
	writeSome(t, e, c, "e2e.a", 400, 25)
	waitFor(t, "the destination reported blocked (full)", time.Minute, func() bool { return len(r.Blocked()) == 1 })
	noDeadLetters(t, e, r)
	cfg.MaxMsgs = 10000
	if _, err := js.UpdateStream(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the outbox to drain after the limit was raised", time.Minute, func() bool { return outstanding(t, e) == 0 })
	verify(t, &env{target: &target{name: "nats", read: func(t *testing.T, c *brokertest.Checker) int { return readStream(t, js, cfg.Name, c) }}}, c)
	noDeadLetters(t, e, r)
}

// A broker outage with MaxAttempts 3: publishes made while the broker is
// down fail for certain or are stored, and cost no attempt; nothing is
// dead-lettered that the broker stored, and nothing is lost. (The issue's
// scenario is 40 s with the default backoff; with a 5–20 ms backoff, 12 s
// spends the same attempts many times over.)
func TestMistakeNATSOutage(t *testing.T) {
	t.Parallel()
	e, ns, js := natsMistake(t, mistakeStream)
	r := mistakeRelay(t, e, ns.url(), 3)
	c := brokertest.NewChecker()
	var stop atomic.Bool
	done := make(chan struct{})
	go func() {
		defer close(done)
		(&writer{e: e, checker: c}).run(&stop, t, 0, 50, 1<<30)
	}()
	waitFor(t, "publishing under way", time.Minute, func() bool { return r.Stats().Published > 200 })
	ns.stop()
	waitFor(t, "the outage noticed", time.Minute, func() bool { return len(r.Blocked()) > 0 })
	time.Sleep(12 * time.Second) // the outage (the scenario, not a synchronisation)
	ns.start()
	stop.Store(true)
	<-done
	waitFor(t, "the outbox to drain after the outage", 2*time.Minute, func() bool { return outstanding(t, e) == 0 })
	verify(t, &env{target: &target{name: "nats", read: func(t *testing.T, c *brokertest.Checker) int { return readStream(t, js, mistakeStream.Name, c) }}}, c)
	noDeadLetters(t, e, r)
}

// A Kafka topic that does not exist yet: its messages wait; once the
// operator creates it, all arrive in key order, nothing dead-lettered.
func TestMistakeKafkaTopicMissing(t *testing.T) {
	t.Parallel()
	e := setupWith(t, 8, func(t *testing.T) *target { return &target{name: "kafka"} })
	seeds, _ := testenv.Kafka(t)
	r := mistakeRelay(t, e, "kafka://"+strings.Join(seeds, ","), 1)
	c := brokertest.NewChecker()
	writeSome(t, e, c, "e2e.late", 300, 20)
	waitFor(t, "the destination reported blocked", time.Minute, func() bool { return len(r.Blocked()) == 1 })
	noDeadLetters(t, e, r)
	cl, err := kgo.NewClient(kgo.SeedBrokers(seeds...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	if _, err := kadm.NewClient(cl).CreateTopic(context.Background(), 4, 1, nil, "e2e.late"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the outbox to drain after the topic was created", time.Minute, func() bool { return outstanding(t, e) == 0 })
	verify(t, &env{target: &target{name: "kafka", read: kafkaReader(seeds, []string{"e2e.late"})}}, c)
	noDeadLetters(t, e, r)
}

// A RabbitMQ exchange with no queue bound returns every mandatory publish:
// the messages wait; once the operator binds a queue, all arrive in key
// order, nothing dead-lettered.
func TestMistakeRabbitMQExchangeUnbound(t *testing.T) {
	t.Parallel()
	tg, ch, name := rabbitExchange(t, false)
	e := setupWith(t, 8, func(t *testing.T) *target { return tg })
	r := mistakeRelay(t, e, tg.url, 1)
	c := brokertest.NewChecker()
	writeSome(t, e, c, "e2e.a", 300, 20)
	waitFor(t, "the destination reported blocked (unroutable)", time.Minute, func() bool { return len(r.Blocked()) == 1 })
	noDeadLetters(t, e, r)
	if err := ch.QueueBind(name, "e2e.#", name, false, nil); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the outbox to drain after the binding", time.Minute, func() bool { return outstanding(t, e) == 0 })
	verify(t, e, c)
	noDeadLetters(t, e, r)
}

// rabbitQueueReader reads queue name back in queue order.
func rabbitQueueReader(ch *amqp.Channel, name string) func(t *testing.T, c *brokertest.Checker) int {
	return func(t *testing.T, c *brokertest.Checker) int {
		q, err := ch.QueueDeclarePassive(name, true, false, false, false, nil)
		if err != nil {
			t.Fatal(err)
		}
		deliveries, err := ch.Consume(name, "", true, true, false, false, nil)
		if err != nil {
			t.Fatal(err)
		}
		timeout := time.NewTimer(time.Minute)
		defer timeout.Stop()
		for got := 0; got < q.Messages; got++ {
			select {
			case d := <-deliveries:
				key, _ := d.Headers[outbox.HeaderKey].(string)
				c.Delivered(brokertest.Received{ID: d.MessageId, Key: key, Topic: d.RoutingKey})
			case <-timeout.C:
				t.Fatalf("read %d of the %d messages in queue %s", got, q.Messages, name)
			}
		}
		return q.Messages
	}
}
