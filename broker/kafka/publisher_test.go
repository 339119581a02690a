package kafka_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"github.com/twmb/franz-go/pkg/sasl/plain"

	"github.com/outboxrelay/outbox"
	"github.com/outboxrelay/outbox/broker/kafka"
	"github.com/outboxrelay/outbox/internal/testenv"
)

// TestSameKeySamePartition: on a topic of many partitions, the messages of a
// key land in one partition, in publish order, across batches and
// concurrent callers; keys spread over several partitions.
func TestSameKeySamePartition(t *testing.T) {
	seeds, _ := testenv.Kafka(t)
	createTopic(t, seeds, "orders", 8)
	p := dial(t, kafka.Options{Brokers: seeds})

	const keys, batches, callers = 30, 5, 3
	var wg sync.WaitGroup
	for c := range callers {
		wg.Go(func() {
			for b := range batches {
				msgs := make([]*outbox.Message, keys)
				for k := range msgs {
					msgs[k] = newMessage("orders", fmt.Sprintf("c%d-key-%d", c, k), strconv.Itoa(b))
				}
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				errs := p.Publish(ctx, msgs)
				cancel()
				for i, err := range errs {
					if err != nil {
						t.Errorf("caller %d batch %d message %d: %v", c, b, i, err)
					}
				}
			}
		})
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	partitionOf := map[string]int32{}
	lastBatch := map[string]int{}
	used := map[int32]bool{}
	for _, r := range newReader(t, seeds, "orders").read(t, keys*batches*callers) {
		key := string(r.Key)
		if p, ok := partitionOf[key]; ok && p != r.Partition {
			t.Fatalf("key %s in partitions %d and %d", key, p, r.Partition)
		}
		partitionOf[key] = r.Partition
		used[r.Partition] = true
		b, _ := strconv.Atoi(string(r.Value))
		if last, ok := lastBatch[key]; ok && b != last+1 {
			t.Fatalf("key %s: batch %d read after batch %d", key, b, last)
		}
		lastBatch[key] = b
	}
	if len(used) < 4 {
		t.Errorf("%d keys used only %d of 8 partitions", keys*callers, len(used))
	}
}

// TestMissingTopicIsFast: a topic that does not exist blocks that topic,
// naming it, without waiting for franz-go's unknown-topic retries or the
// delivery timeout.
func TestMissingTopicIsFast(t *testing.T) {
	seeds, _ := testenv.Kafka(t)
	createTopic(t, seeds, "present", 1)
	p := dial(t, kafka.Options{Brokers: seeds})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	start := time.Now()
	errs := p.Publish(ctx, []*outbox.Message{newMessage("absent", "k", "x"), newMessage("present", "k", "y"), newMessage("absent", "j", "z")})
	// Bounded well below the 30 s delivery timeout it must not wait for
	// (generous: CI machines are loaded).
	if elapsed := time.Since(start); elapsed > 10*time.Second {
		t.Errorf("Publish took %v to report a missing topic", elapsed)
	}
	for _, i := range []int{0, 2} {
		if !isBlocked(errs[i], "absent") {
			t.Fatalf("message %d to a missing topic: got %v; want an error blocking \"absent\"", i, errs[i])
		}
		errorContains(t, errs[i], `"absent"`, "does not exist", "AllowAutoTopicCreation")
	}
	if errs[1] != nil {
		t.Fatalf("message to an existing topic: %v", errs[1])
	}
}

// TestDeletedTopic: a topic deleted after the publisher saw it is blocked
// as well (through franz-go's unknown-topic handling), within the delivery
// timeout.
func TestDeletedTopic(t *testing.T) {
	seeds, _ := testenv.Kafka(t)
	createTopic(t, seeds, "doomed", 1)
	p := dial(t, kafka.Options{Brokers: seeds, DeliveryTimeout: 20 * time.Second})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := p.Publish(ctx, []*outbox.Message{newMessage("doomed", "k", "1")})[0]; err != nil {
		t.Fatal(err)
	}
	req := kmsg.NewPtrDeleteTopicsRequest()
	req.TopicNames = []string{"doomed"}
	dt := kmsg.NewDeleteTopicsRequestTopic()
	dt.Topic = kmsg.StringPtr("doomed")
	req.Topics = append(req.Topics, dt)
	resp, err := req.RequestWith(ctx, client(t, seeds))
	if err == nil {
		err = kerr.ErrorForCode(resp.Topics[0].ErrorCode)
	}
	if err != nil {
		t.Fatalf("delete topic: %v", err)
	}
	start := time.Now()
	err = p.Publish(ctx, []*outbox.Message{newMessage("doomed", "k", "2")})[0]
	elapsed := time.Since(start)
	t.Logf("after %v: %v", elapsed, err)
	if elapsed > 10*time.Second {
		t.Errorf("a deleted topic took %v to fail; want a few metadata refreshes, not DeliveryTimeout", elapsed)
	}
	if err == nil {
		t.Fatal("publish to a deleted topic succeeded")
	}
	if ctx.Err() == nil && !isBlocked(err, "doomed") {
		t.Fatalf("publish to a deleted topic: got %v; want an error blocking \"doomed\"", err)
	}
	// The next batch is refused at once: the cache entry is gone.
	start = time.Now()
	err = p.Publish(ctx, []*outbox.Message{newMessage("doomed", "k", "3")})[0]
	if !isBlocked(err, "doomed") || time.Since(start) > 10*time.Second {
		t.Fatalf("second publish to a deleted topic: got %v after %v; want an error blocking \"doomed\" at once", err, time.Since(start))
	}
	// Created again, the topic works again once franz-go has refreshed its
	// metadata (the relay probes a blocked topic with backoff); until then
	// it stays blocked, never failing the message.
	createTopic(t, seeds, "doomed", 1)
	for attempt := 1; ; attempt++ {
		err := p.Publish(ctx, []*outbox.Message{newMessage("doomed", "k", "4")})[0]
		if err == nil {
			t.Logf("the topic created again works after %d attempts", attempt)
			break
		}
		if !isBlocked(err, "doomed") || ctx.Err() != nil {
			t.Fatalf("publish to the topic created again, attempt %d: %v; want nil, or an error blocking the topic until it is seen", attempt, err)
		}
		time.Sleep(100 * time.Millisecond) // polling a condition with backoff, as the relay probes
	}
}

// isBlocked reports whether err blocks destination topic (and is not
// permanent).
func isBlocked(err error, topic string) bool {
	dest, ok := outbox.IsBlocked(err)
	return ok && dest == topic && !outbox.IsPermanent(err)
}

// TestAutoTopicCreation: with AllowAutoTopicCreation (and a broker that
// allows it) a missing topic is created by the first publish.
func TestAutoTopicCreation(t *testing.T) {
	seeds, _ := testenv.Kafka(t, kfake.AllowAutoTopicCreation(), kfake.DefaultNumPartitions(2))
	p := dial(t, kafka.Options{Brokers: seeds, AllowAutoTopicCreation: true})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	m := newMessage("created.on.demand", "k", "x")
	if err := p.Publish(ctx, []*outbox.Message{m})[0]; err != nil {
		t.Fatalf("publish with auto-creation: %v", err)
	}
	if r := newReader(t, seeds, "created.on.demand").read(t, 1)[0]; received(t, r).ID != m.ID {
		t.Fatalf("read %v; want %s", r, m.ID)
	}
}

// TestRecordLayout checks key, value, headers and timestamp of a record.
func TestRecordLayout(t *testing.T) {
	seeds, _ := testenv.Kafka(t)
	createTopic(t, seeds, "layout", 1)
	p := dial(t, kafka.Options{Brokers: seeds})
	created := time.Date(2025, 3, 4, 5, 6, 7, 123456789, time.FixedZone("X", 3600))
	withKey := &outbox.Message{ID: outbox.NewID(), Topic: "layout", Key: "k1", Payload: []byte{0, 1}, CreatedAt: created,
		Headers: map[string]string{"Traceparent": "00-abc-def-01"}}
	noKey := &outbox.Message{ID: outbox.NewID(), Topic: "layout", Payload: []byte("v")}
	before := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for i, err := range p.Publish(ctx, []*outbox.Message{withKey, noKey}) {
		if err != nil {
			t.Fatalf("message %d: %v", i, err)
		}
	}
	recs := newReader(t, seeds, "layout").read(t, 2)
	r := recs[0]
	h := received(t, r).Headers
	if string(r.Key) != "k1" || string(r.Value) != "\x00\x01" {
		t.Errorf("key %q value %q", r.Key, r.Value)
	}
	if h[outbox.HeaderID] != withKey.ID || h[outbox.HeaderCreatedAt] != "2025-03-04T04:06:07.123456789Z" || h["Traceparent"] != "00-abc-def-01" {
		t.Errorf("headers %v", h)
	}
	if r.Timestamp.Before(before.Add(-time.Second)) {
		t.Errorf("record timestamp %v is not the produce time (CreatedAt %v)", r.Timestamp, created)
	}
	if recs[1].Key != nil {
		t.Errorf("a message without key has record key %q; want none", recs[1].Key)
	}
	if _, ok := received(t, recs[1]).Headers[outbox.HeaderCreatedAt]; ok {
		t.Errorf("a message without CreatedAt has an %s header", outbox.HeaderCreatedAt)
	}
}

// TestPermanentMessageErrors: problems of one message fail that message
// only, permanently.
func TestPermanentMessageErrors(t *testing.T) {
	seeds, _ := testenv.Kafka(t)
	createTopic(t, seeds, "fine", 1)
	p := dial(t, kafka.Options{Brokers: seeds, MaxMessageBytes: 4096, TopicMapper: func(topic string) string {
		if topic == "bad" {
			return "bad/name"
		}
		return topic
	}})
	msgs := []*outbox.Message{
		newMessage("fine", "a", strings.Repeat("x", 5000)),
		newMessage("bad", "b", "x"),
		{Topic: "fine", Payload: []byte("no id")},
		newMessage("fine", "d", "ok"),
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	errs := p.Publish(ctx, msgs)
	for i, want := range []string{"MaxMessageBytes", "invalid Kafka topic name", "no ID"} {
		if !outbox.IsPermanent(errs[i]) {
			t.Errorf("message %d: got %v; want a permanent error", i, errs[i])
			continue
		}
		errorContains(t, errs[i], want)
	}
	if errs[3] != nil {
		t.Fatalf("the valid message failed: %v", errs[3])
	}
}

// TestRecoversAfterRestart: the cluster restarts between two batches; the
// publisher's next batch goes through, and both are readable.
func TestRecoversAfterRestart(t *testing.T) {
	seeds, _ := testenv.Kafka(t)
	createTopic(t, seeds, "restart", 1)
	p := dial(t, kafka.Options{Brokers: seeds})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	first := newMessage("restart", "k", "before")
	if err := p.Publish(ctx, []*outbox.Message{first})[0]; err != nil {
		t.Fatal(err)
	}
	testenv.RestartKafka(t)
	second := newMessage("restart", "k", "after")
	if err := p.Publish(ctx, []*outbox.Message{second})[0]; err != nil {
		t.Fatalf("publish after restart: %v", err)
	}
	recs := newReader(t, seeds, "restart").read(t, 2)
	if received(t, recs[0]).ID != first.ID || received(t, recs[1]).ID != second.ID {
		t.Fatalf("read %s, %s; want %s, %s", received(t, recs[0]).ID, received(t, recs[1]).ID, first.ID, second.ID)
	}
}

// TestBrokersDown: with every broker gone, Publish returns at its deadline
// with errors blocking the topic.
func TestBrokersDown(t *testing.T) {
	seeds, c := testenv.Kafka(t)
	createTopic(t, seeds, "down", 1)
	p := dial(t, kafka.Options{Brokers: seeds})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := p.Publish(ctx, []*outbox.Message{newMessage("down", "k", "1")})[0]; err != nil {
		t.Fatal(err)
	}
	c.Close()
	short, cancelShort := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancelShort()
	start := time.Now()
	err := p.Publish(short, []*outbox.Message{newMessage("down", "k", "2")})[0]
	if elapsed := time.Since(start); elapsed > 3*time.Second {
		t.Errorf("Publish took %v with a 500ms deadline", elapsed)
	}
	if !isBlocked(err, "down") {
		t.Fatalf("publish with the brokers down: got %v; want an error blocking \"down\"", err)
	}
}

func TestDialErrors(t *testing.T) {
	free, err := testenv.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	nobody := "127.0.0.1:" + strconv.Itoa(free)
	_, err = kafka.Dial(ctx, kafka.Options{Brokers: []string{nobody}})
	errorContains(t, err, nobody, "check Brokers")
}

func TestOptionsValidate(t *testing.T) {
	ok := []string{"127.0.0.1:9092"}
	for _, tc := range []struct {
		opts kafka.Options
		want string
	}{
		{kafka.Options{}, "Brokers is empty"},
		{kafka.Options{Brokers: []string{"localhost"}}, `"localhost" is not host:port`},
		{kafka.Options{Brokers: []string{":9092"}}, "Brokers"},
		{kafka.Options{Brokers: []string{"h:99999"}}, "Brokers"},
		{kafka.Options{Brokers: ok, DeliveryTimeout: time.Millisecond}, "DeliveryTimeout"},
		{kafka.Options{Brokers: ok, PublishTimeout: -1}, "PublishTimeout"},
		{kafka.Options{Brokers: ok, MaxBufferedRecords: -1}, "MaxBufferedRecords"},
		{kafka.Options{Brokers: ok, MaxMessageBytes: 100}, "MaxMessageBytes"},
		{kafka.Options{Brokers: ok, KeyPipeline: -1}, "KeyPipeline"},
		{kafka.Options{Brokers: ok, Linger: -1}, "Linger"},
	} {
		_, err := kafka.Dial(context.Background(), tc.opts)
		errorContains(t, err, tc.want)
	}
}

// TestNotAuthorizedIsBlocked: a topic the client's principal may not write
// blocks that topic (TOPIC_AUTHORIZATION_FAILED), while a topic it may
// write works.
func TestNotAuthorizedIsBlocked(t *testing.T) {
	allow := func(topic string, op kmsg.ACLOperation) kfake.ACL {
		return kfake.ACL{Resource: kmsg.ACLResourceTypeTopic, Name: topic, Pattern: kmsg.ACLResourcePatternTypeLiteral, Operation: op, Allow: true}
	}
	seeds, _ := testenv.Kafka(t,
		kfake.EnableSASL(), kfake.EnableACLs(),
		kfake.Superuser("PLAIN", "admin", "admin"),
		kfake.User("PLAIN", "relay", "pw", allow("open", kmsg.ACLOperationWrite), allow("open", kmsg.ACLOperationDescribe)),
		kfake.SeedTopics(1, "open", "secret"),
	)
	p := dial(t, kafka.Options{Brokers: seeds, ClientOptions: []kgo.Opt{kgo.SASL(plain.Auth{User: "relay", Pass: "pw"}.AsMechanism())}})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	errs := p.Publish(ctx, []*outbox.Message{newMessage("open", "k", "1"), newMessage("secret", "k", "2")})
	if errs[0] != nil {
		t.Fatalf("publish to a topic the principal may write: %v", errs[0])
	}
	if !isBlocked(errs[1], "secret") {
		t.Fatalf("publish to a topic the principal may not write: %v; want an error blocking \"secret\"", errs[1])
	}
	errorContains(t, errs[1], "not authorized", `"secret"`)
}
