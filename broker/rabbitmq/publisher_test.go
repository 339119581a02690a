package rabbitmq_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outboxrelay/outbox"
	"github.com/outboxrelay/outbox/broker/rabbitmq"
	"github.com/outboxrelay/outbox/internal/testenv"
)

// isBlocked reports whether err blocks destination topic (and is not
// permanent).
func isBlocked(err error, topic string) bool {
	dest, ok := outbox.IsBlocked(err)
	return ok && dest == topic && !outbox.IsPermanent(err)
}

// TestUnroutableIsBlocked: with the mandatory flag, a message that no queue
// receives is returned by the broker and blocks its topic (no binding is a
// fault of the destination, not of the message), naming exchange, routing
// key and topic, while the broker confirms it; the other messages of the
// batch succeed.
func TestUnroutableIsBlocked(t *testing.T) {
	exchange := "ex_" + testenv.Name(t)
	p := dial(t, rabbitmq.Options{
		Exchange:   exchange,
		RoutingKey: func(topic string) string { return "rk." + topic },
	})
	t.Cleanup(func() { deleteExchange(t, exchange) })
	queue := queueFor(t, "classic", exchange, "rk.bound", nil)

	msgs := []*outbox.Message{
		newMessage("bound", "a", "first"),
		newMessage("unbound", "b", "lost"),
		newMessage("bound", "c", "last"),
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	errs := p.Publish(ctx, msgs)
	if errs[0] != nil || errs[2] != nil {
		t.Fatalf("routable messages failed: %v, %v", errs[0], errs[2])
	}
	if !isBlocked(errs[1], "unbound") {
		t.Fatalf("unroutable message: got %v; want an error blocking \"unbound\"", errs[1])
	}
	errorContains(t, errs[1], "unroutable", strconv.Quote(exchange), `"rk.unbound"`, `"unbound"`, "NO_ROUTE")

	got := read(t, queue, 2)
	if got[0].MessageId != msgs[0].ID || got[1].MessageId != msgs[2].ID {
		t.Fatalf("read %s, %s; want %s, %s", got[0].MessageId, got[1].MessageId, msgs[0].ID, msgs[2].ID)
	}
	if got[0].RoutingKey != "rk.bound" {
		t.Errorf("routing key %q; want rk.bound", got[0].RoutingKey)
	}
}

// TestReturnsMatchedUnderConcurrency: many concurrent batches mixing routable
// and unroutable messages on a few channels; every result must be exactly
// right, which fails if a confirm were reported before its return had been
// seen, or a return attached to the wrong message.
func TestReturnsMatchedUnderConcurrency(t *testing.T) {
	p := dial(t, rabbitmq.Options{Channels: 2, MaxInFlight: 300})
	topic := "rmq." + testenv.Name(t)
	queue := queueFor(t, "classic", rabbitmq.ExchangeDefault, topic, nil)
	missing := "rmq.missing." + testenv.Name(t)

	const goroutines, batches, size = 6, 10, 100
	var wg sync.WaitGroup
	var mu sync.Mutex
	routed := 0
	for g := range goroutines {
		wg.Go(func() {
			for b := range batches {
				msgs := make([]*outbox.Message, size)
				for i := range msgs {
					to := topic
					if (i+b+g)%3 == 0 {
						to = missing
					}
					msgs[i] = newMessage(to, fmt.Sprintf("g%d-%d", g, i), "x")
				}
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				errs := p.Publish(ctx, msgs)
				cancel()
				for i, err := range errs {
					switch {
					case msgs[i].Topic == topic && err != nil:
						t.Errorf("goroutine %d batch %d: routable message %d failed: %v", g, b, i, err)
					case msgs[i].Topic == missing && !isBlocked(err, missing):
						t.Errorf("goroutine %d batch %d: unroutable message %d: got %v; want an error blocking its topic", g, b, i, err)
					case msgs[i].Topic == topic:
						mu.Lock()
						routed++
						mu.Unlock()
					}
				}
			}
		})
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	for _, d := range read(t, queue, routed) {
		if d.Type != topic {
			t.Fatalf("read a message of topic %q", d.Type)
		}
	}
}

// TestAllowUnroutable: without the mandatory flag an unroutable message is
// confirmed and counts as published.
func TestAllowUnroutable(t *testing.T) {
	p := dial(t, rabbitmq.Options{AllowUnroutable: true})
	publishAll(t, p, newMessage("rmq.nobody."+testenv.Name(t), "", "dropped"))
}

// TestPropertiesAndHeaders checks the AMQP properties and headers a message
// is published with.
func TestPropertiesAndHeaders(t *testing.T) {
	p := dial(t, rabbitmq.Options{})
	topic := "rmq." + testenv.Name(t)
	queue := queueFor(t, "classic", rabbitmq.ExchangeDefault, topic, nil)
	created := time.Date(2025, 3, 4, 5, 6, 7, 123456789, time.FixedZone("X", 3600))
	plain := &outbox.Message{ID: outbox.NewID(), Topic: topic, Key: "k1", Payload: []byte{0, 1, 2}, CreatedAt: created,
		Headers: map[string]string{"Traceparent": "00-abc-def-01"}}
	jsonMsg := &outbox.Message{ID: outbox.NewID(), Topic: topic, Payload: []byte(`{}`),
		Headers: map[string]string{"content-type": "application/json"}}
	publishAll(t, p, plain, jsonMsg)

	got := read(t, queue, 2)
	d := got[0]
	checks := []struct {
		name      string
		got, want any
	}{
		{"message-id", d.MessageId, plain.ID},
		{"type", d.Type, topic},
		{"content-type", d.ContentType, "application/octet-stream"},
		{"delivery-mode", d.DeliveryMode, amqp.Persistent},
		{"timestamp", d.Timestamp.Unix(), created.Unix()},
		{"header " + outbox.HeaderID, d.Headers[outbox.HeaderID], plain.ID},
		{"header " + outbox.HeaderKey, d.Headers[outbox.HeaderKey], "k1"},
		{"header " + outbox.HeaderCreatedAt, d.Headers[outbox.HeaderCreatedAt], "2025-03-04T04:06:07.123456789Z"},
		{"header Traceparent", d.Headers["Traceparent"], "00-abc-def-01"},
		{"body", string(d.Body), "\x00\x01\x02"},
		{"json content-type", got[1].ContentType, "application/json"},
		{"json header content-type", got[1].Headers["content-type"], "application/json"},
	}
	for _, c := range checks {
		if c.got != c.want {
			t.Errorf("%s = %v; want %v", c.name, c.got, c.want)
		}
	}
	if _, ok := got[1].Headers[outbox.HeaderKey]; ok {
		t.Errorf("a message without key has an %s header", outbox.HeaderKey)
	}
	if _, ok := got[1].Headers[outbox.HeaderCreatedAt]; ok {
		t.Errorf("a message without CreatedAt has an %s header", outbox.HeaderCreatedAt)
	}
}

func TestTransient(t *testing.T) {
	p := dial(t, rabbitmq.Options{Transient: true})
	topic := "rmq." + testenv.Name(t)
	queue := queueFor(t, "classic", rabbitmq.ExchangeDefault, topic, nil)
	publishAll(t, p, newMessage(topic, "", "x"))
	if d := read(t, queue, 1)[0]; d.DeliveryMode != amqp.Transient {
		t.Fatalf("delivery mode %d; want %d (transient)", d.DeliveryMode, amqp.Transient)
	}
}

// TestNackIsBlocked: a queue full with overflow reject-publish makes the
// broker nack; that blocks the topic (the queue, not the message, is at
// fault) for those messages only.
func TestNackIsBlocked(t *testing.T) {
	p := dial(t, rabbitmq.Options{})
	topic := "rmq." + testenv.Name(t)
	queueFor(t, "classic", rabbitmq.ExchangeDefault, topic, amqp.Table{"x-max-length": int32(2), "x-overflow": "reject-publish"})
	msgs := []*outbox.Message{newMessage(topic, "a", "1"), newMessage(topic, "b", "2"), newMessage(topic, "c", "3")}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	errs := p.Publish(ctx, msgs)
	if errs[0] != nil || errs[1] != nil {
		t.Fatalf("the first two messages fit in the queue but failed: %v, %v", errs[0], errs[1])
	}
	if !isBlocked(errs[2], topic) {
		t.Fatalf("the third message: got %v; want an error blocking %q", errs[2], topic)
	}
	errorContains(t, errs[2], "nack")
}

// TestMaxInFlightSmallerThanBatch: a batch far larger than MaxInFlight, from
// several goroutines at once, completes (the call settles its own confirms
// to make room) and everything is delivered.
func TestMaxInFlightSmallerThanBatch(t *testing.T) {
	p := dial(t, rabbitmq.Options{MaxInFlight: 3, Channels: 2})
	topic := "rmq." + testenv.Name(t)
	queue := queueFor(t, "quorum", rabbitmq.ExchangeDefault, topic, nil)
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			msgs := make([]*outbox.Message, 200)
			for i := range msgs {
				msgs[i] = newMessage(topic, fmt.Sprintf("g%d-%d", g, i), "x")
			}
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			for i, err := range p.Publish(ctx, msgs) {
				if err != nil {
					t.Errorf("goroutine %d message %d: %v", g, i, err)
					return
				}
			}
		})
	}
	wg.Wait()
	if !t.Failed() {
		read(t, queue, 800)
	}
}

// TestExchangeDeletedIsRedeclared: with the exchange declared by the
// Publisher, deleting it makes in-flight publishes fail (blocking their
// topic) at worst, and the Publisher declares it again on its next channel.
func TestExchangeDeletedIsRedeclared(t *testing.T) {
	exchange := "ex_" + testenv.Name(t)
	p := dial(t, rabbitmq.Options{Exchange: exchange, Channels: 1})
	t.Cleanup(func() { deleteExchange(t, exchange) })
	topic := "rmq." + testenv.Name(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// Open the channel (the message is unroutable: no queue yet).
	if errs := p.Publish(ctx, []*outbox.Message{newMessage("rmq.nothing", "", "x")}); !isBlocked(errs[0], "rmq.nothing") {
		t.Fatalf("publish with no queue bound: got %v; want an error blocking rmq.nothing", errs[0])
	}
	deleteExchange(t, exchange)

	// Publishing to a deleted exchange closes the channel (404): the topic
	// is blocked until the Publisher declares the exchange again.
	errs := p.Publish(ctx, []*outbox.Message{newMessage(topic, "", "y")})
	if !isBlocked(errs[0], topic) {
		t.Fatalf("publish to the deleted exchange: got %v; want an error blocking %q", errs[0], topic)
	}
	errorContains(t, errs[0], "NOT_FOUND", exchange)
	// The next call opens a new channel, which declares the exchange.
	p.Publish(ctx, []*outbox.Message{newMessage(topic, "", "z")})
	queue := queueFor(t, "classic", exchange, topic, nil)
	m := newMessage(topic, "", "after")
	publishAll(t, p, m)
	if d := read(t, queue, 1)[0]; d.MessageId != m.ID {
		t.Fatalf("read %s; want %s", d.MessageId, m.ID)
	}
}

// TestPassiveExchange: with PassiveExchange the exchange must exist (Dial
// says so), and if it disappears the messages block their topic (NOT_FOUND
// 404) until it exists again.
func TestPassiveExchange(t *testing.T) {
	exchange := "ex_" + testenv.Name(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err := rabbitmq.Dial(ctx, testenv.RabbitMQ(t), rabbitmq.Options{Exchange: exchange, PassiveExchange: true})
	errorContains(t, err, strconv.Quote(exchange), "does not exist", "PassiveExchange")

	ch := admin(t)
	if err := ch.ExchangeDeclare(exchange, amqp.ExchangeFanout, false, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { deleteExchange(t, exchange) })
	p := dial(t, rabbitmq.Options{Exchange: exchange, PassiveExchange: true, Channels: 1})
	queue := queueFor(t, "classic", exchange, "ignored-by-fanout", nil)
	m := newMessage("any.topic", "", "fanout")
	publishAll(t, p, m)
	if d := read(t, queue, 1)[0]; d.MessageId != m.ID {
		t.Fatalf("read %s; want %s", d.MessageId, m.ID)
	}

	deleteExchange(t, exchange)
	errs := p.Publish(ctx, []*outbox.Message{newMessage("any.topic", "", "lost")})
	if !isBlocked(errs[0], "any.topic") {
		t.Fatalf("publish to a deleted passive exchange: got %v; want an error blocking any.topic", errs[0])
	}
	errorContains(t, errs[0], strconv.Quote(exchange), "PassiveExchange")
}

// TestExchangeWithOtherSettings: Dial refuses an existing exchange of another
// type, saying what to change.
func TestExchangeWithOtherSettings(t *testing.T) {
	exchange := "ex_" + testenv.Name(t)
	ch := admin(t)
	if err := ch.ExchangeDeclare(exchange, amqp.ExchangeFanout, true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { deleteExchange(t, exchange) })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err := rabbitmq.Dial(ctx, testenv.RabbitMQ(t), rabbitmq.Options{Exchange: exchange})
	errorContains(t, err, strconv.Quote(exchange), "other settings", "PassiveExchange")
}

func TestDialErrors(t *testing.T) {
	good := testenv.RabbitMQ(t)
	port := good[strings.LastIndex(good, ":")+1 : len(good)-1]
	free, err := testenv.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, tc := range []struct {
		name, url string
		wants     []string
	}{
		{"bad scheme", "http://guest:secret@127.0.0.1:" + port + "/", []string{"invalid URL", "http://guest:xxxxx@127.0.0.1", "amqp://user:password@host:5672/vhost"}},
		{"wrong password", "amqp://guest:secret@127.0.0.1:" + port + "/", []string{"refused the credentials", "check the user and password", "amqp://guest:xxxxx@127.0.0.1:" + port}},
		{"unknown vhost", "amqp://guest:guest@127.0.0.1:" + port + "/nope", []string{"virtual host", "/nope"}},
		{"nobody listening", "amqp://guest:secret@127.0.0.1:" + strconv.Itoa(free) + "/", []string{"cannot connect", "amqp://guest:xxxxx@127.0.0.1:" + strconv.Itoa(free), "host and port"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := rabbitmq.Dial(ctx, tc.url, rabbitmq.Options{})
			if err == nil {
				p.Close()
				t.Fatal("Dial succeeded")
			}
			errorContains(t, err, tc.wants...)
			if strings.Contains(err.Error(), "secret") {
				t.Errorf("the error shows the password: %v", err)
			}
		})
	}
}

func TestOptionsValidate(t *testing.T) {
	for _, tc := range []struct {
		opts rabbitmq.Options
		want string
	}{
		{rabbitmq.Options{Exchange: "bad name"}, "Exchange"},
		{rabbitmq.Options{Exchange: strings.Repeat("x", 256)}, "Exchange"},
		{rabbitmq.Options{Exchange: "amq.topic"}, "PassiveExchange"},
		{rabbitmq.Options{MaxInFlight: -1}, "MaxInFlight"},
		{rabbitmq.Options{MaxInFlight: rabbitmq.MaxInFlightMax + 1}, "MaxInFlight"},
		{rabbitmq.Options{Channels: rabbitmq.ChannelsMax + 1}, "Channels"},
		{rabbitmq.Options{PublishTimeout: -time.Second}, "PublishTimeout"},
		{rabbitmq.Options{MaxMessageSize: rabbitmq.MaxMessageSizeMax + 1}, "MaxMessageSize"},
		{rabbitmq.Options{Heartbeat: time.Millisecond}, "Heartbeat"},
		{rabbitmq.Options{ReconnectBackoff: time.Minute}, "ReconnectBackoff"},
	} {
		_, err := rabbitmq.Dial(context.Background(), "amqp://127.0.0.1:1/", tc.opts)
		errorContains(t, err, tc.want)
	}
}

// TestPermanentMessageErrors: per-message problems found before sending fail
// that message only, permanently.
func TestPermanentMessageErrors(t *testing.T) {
	p := dial(t, rabbitmq.Options{MaxMessageSize: 100, RoutingKey: func(topic string) string {
		if topic == "rmq.long" {
			return strings.Repeat("k", 256)
		}
		return topic
	}})
	topic := "rmq." + testenv.Name(t)
	queue := queueFor(t, "classic", rabbitmq.ExchangeDefault, topic, nil)
	huge := map[string]string{}
	for i := range 40 {
		huge[fmt.Sprintf("H%d", i)] = strings.Repeat("v", outbox.MaxHeaderValueLen)
	}
	msgs := []*outbox.Message{
		newMessage(topic, "", strings.Repeat("x", 101)),
		{Topic: topic, Payload: []byte("no id")},
		newMessage("rmq.long", "", "x"),
		{ID: outbox.NewID(), Topic: topic, Payload: []byte("h"), Headers: huge},
		newMessage(topic, "", "fine"),
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	errs := p.Publish(ctx, msgs)
	wants := []string{"MaxMessageSize", "no ID", "routing key of 256 bytes", "frame_max"}
	for i, want := range wants {
		if !outbox.IsPermanent(errs[i]) {
			t.Errorf("message %d: got %v; want a permanent error", i, errs[i])
			continue
		}
		errorContains(t, errs[i], want)
	}
	if errs[4] != nil {
		t.Fatalf("the valid message failed: %v", errs[4])
	}
	if d := read(t, queue, 1)[0]; d.MessageId != msgs[4].ID {
		t.Fatalf("read %s; want only the valid message %s", d.MessageId, msgs[4].ID)
	}
}

func deleteExchange(t testing.TB, name string) {
	t.Helper()
	conn, err := amqp.Dial(testenv.RabbitMQ(t))
	if err != nil {
		t.Errorf("delete exchange %s: %v", name, err)
		return
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err == nil {
		err = ch.ExchangeDelete(name, false, false)
	}
	if err != nil {
		t.Errorf("delete exchange %s: %v", name, err)
	}
}

// TestBlockedByAlarm: while a memory alarm blocks publishers, Publish fails
// at once with an error blocking the topic (or, for messages written before
// the broker's notification arrived, at its deadline); once the alarm clears,
// publishing works again and nothing confirmed is lost.
func TestBlockedByAlarm(t *testing.T) {
	p := dial(t, rabbitmq.Options{Channels: 1})
	topic := "rmq." + testenv.Name(t)
	queue := queueFor(t, "classic", rabbitmq.ExchangeDefault, topic, nil)
	var confirmed []string
	first := newMessage(topic, "", "before the alarm")
	publishAll(t, p, first)
	confirmed = append(confirmed, first.ID)

	testenv.RabbitMQCtl(t, "set_vm_memory_high_watermark", "absolute", "1")
	restored := false
	restore := func() {
		if !restored {
			restored = true
			testenv.RabbitMQCtl(t, "set_vm_memory_high_watermark", "0.4")
		}
	}
	t.Cleanup(restore)

	deadline := time.Now().Add(30 * time.Second)
	for {
		m := newMessage(topic, "", "during the alarm")
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		start := time.Now()
		err := p.Publish(ctx, []*outbox.Message{m})[0]
		elapsed := time.Since(start)
		cancel()
		if elapsed > 2*time.Second+time.Second {
			t.Fatalf("Publish took %v with a 2s deadline", elapsed)
		}
		if err == nil {
			confirmed = append(confirmed, m.ID) // the alarm is not in force yet
		} else if strings.Contains(err.Error(), "blocks publishers") {
			if !isBlocked(err, topic) {
				t.Fatalf("blocked by the alarm: got %v; want an error blocking %q", err, topic)
			}
			if elapsed > 1500*time.Millisecond { // well before the 2 s deadline
				t.Errorf("Publish took %v to report that the broker blocks publishers; want at once", elapsed)
			}
			t.Logf("blocked: %v", err)
			break
		} else if outbox.IsPermanent(err) {
			t.Fatalf("during the alarm: got a permanent error %v", err)
		}
		if time.Now().After(deadline) {
			t.Fatalf("Publish never reported the memory alarm; last error: %v", err)
		}
	}

	restore()
	deadline = time.Now().Add(30 * time.Second)
	for {
		m := newMessage(topic, "", "after the alarm")
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		err := p.Publish(ctx, []*outbox.Message{m})[0]
		cancel()
		if err == nil {
			confirmed = append(confirmed, m.ID)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("publishing still fails 30s after the alarm cleared: %v", err)
		}
	}
	remaining := map[string]bool{}
	for _, id := range confirmed {
		remaining[id] = true
	}
	for len(remaining) > 0 {
		for _, d := range read(t, queue, len(remaining)) {
			delete(remaining, d.MessageId)
		}
	}
}

// TestAccessRefusedIsBlocked: a user who may declare the exchange but not
// write to it gets ACCESS_REFUSED (403) when publishing: that blocks the
// topic (a permission is the destination's business, not the message's),
// and the error says what to grant.
func TestAccessRefusedIsBlocked(t *testing.T) {
	user := "u_" + testenv.Name(t)
	testenv.RabbitMQCtl(t, "add_user", user, "pw")
	t.Cleanup(func() { testenv.RabbitMQCtl(t, "delete_user", user) })
	// configure: everything; write: nothing; read: everything.
	testenv.RabbitMQCtl(t, "set_permissions", "-p", "/", user, ".*", "^$", ".*")
	exchange := "ex_" + testenv.Name(t)
	t.Cleanup(func() { deleteExchange(t, exchange) })
	url := strings.Replace(testenv.RabbitMQ(t), "guest:guest", user+":pw", 1)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	p, err := rabbitmq.Dial(ctx, url, rabbitmq.Options{Exchange: exchange, Channels: 1})
	if err != nil {
		t.Fatalf("dial as a user who may configure the exchange: %v", err)
	}
	defer p.Close()
	topic := "rmq." + testenv.Name(t)
	errs := p.Publish(ctx, []*outbox.Message{newMessage(topic, "a", "1"), newMessage(topic, "b", "2")})
	for i, err := range errs {
		if !isBlocked(err, topic) {
			t.Fatalf("message %d published without write permission: %v; want an error blocking %q", i, err, topic)
		}
	}
	errorContains(t, errs[0], "ACCESS_REFUSED", "write permission")
}
