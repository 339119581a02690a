package consume_test

import (
	"context"
	"database/sql"
	"errors"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxrelay/outbox"
	"github.com/outboxrelay/outbox/inbox"
	"github.com/outboxrelay/outbox/inbox/consume"
)

// kafkaSeeds starts an in-process kfake cluster with topic for this test.
// (Switch to testenv.Kafka once the test environment provides it.)
func kafkaSeeds(t *testing.T, topic string) []string {
	t.Helper()
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, topic))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c.ListenAddrs()
}

func kafkaConsumer(t *testing.T, seeds []string, topic string) *kgo.Client {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(seeds...), kgo.ConsumerGroup("billing"), kgo.ConsumeTopics(topic),
		kgo.AutoCommitMarks(), kgo.FetchMaxWait(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	return cl
}

// pollN polls until n records arrived.
func pollN(t *testing.T, cl *kgo.Client, n int) []*kgo.Record {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var recs []*kgo.Record
	for len(recs) < n {
		fs := cl.PollRecords(ctx, n-len(recs))
		if err := ctx.Err(); err != nil {
			t.Fatalf("got %d of %d records: %v", len(recs), n, err)
		}
		fs.EachError(func(topic string, p int32, err error) { t.Fatalf("fetch %s/%d: %v", topic, p, err) })
		recs = append(recs, fs.Records()...)
	}
	return recs
}

// dropMarks is a Marker of a process that dies before marking.
type dropMarks struct{}

func (dropMarks) MarkCommitRecords(...*kgo.Record) {}

func kafkaEffect(ctx context.Context, tx *sql.Tx, rec *kgo.Record) error {
	return applyEffect(ctx, tx, consume.KafkaMessageID(rec))
}

// TestKafkaCrashBetweenCommitAndMark: the handler's transaction commits, then
// the process dies before marking the record; the group's next member reads
// it again from the committed offset and the inbox drops it. A repeated
// record and one without an ID are marked (skipped) too.
func TestKafkaCrashBetweenCommitAndMark(t *testing.T) {
	t.Parallel()
	const topic = "orders"
	seeds := kafkaSeeds(t, topic)
	in, db := newInbox(t)
	ctx := context.Background()

	prod, err := kgo.NewClient(kgo.SeedBrokers(seeds...), kgo.DefaultProduceTopic(topic))
	if err != nil {
		t.Fatal(err)
	}
	defer prod.Close()
	id := outbox.NewID()
	withID := func() *kgo.Record {
		return &kgo.Record{Value: []byte("{}"), Headers: []kgo.RecordHeader{{Key: outbox.HeaderID, Value: []byte(id)}}}
	}
	if err := prod.ProduceSync(ctx, withID(), &kgo.Record{Value: []byte("no id")}, withID()).FirstErr(); err != nil {
		t.Fatal(err)
	}

	cl1 := kafkaConsumer(t, seeds, topic)
	first := consume.Kafka[*sql.Tx]{Runner: in, Consumer: "billing", Handler: kafkaEffect, Marker: dropMarks{}}
	if processed, err := first.Handle(ctx, pollN(t, cl1, 1)[0]); !processed || err != nil {
		t.Fatalf("first delivery: Handle = %v, %v; want true, nil", processed, err)
	}
	cl1.Close() // dies: nothing marked, nothing committed

	cl2 := kafkaConsumer(t, seeds, topic)
	defer cl2.Close()
	h := consume.Kafka[*sql.Tx]{Runner: in, Consumer: "billing", Handler: kafkaEffect, Marker: cl2}
	recs := pollN(t, cl2, 3)
	if recs[0].Offset != 0 {
		t.Fatalf("the restarted member starts at offset %d; want 0", recs[0].Offset)
	}
	for i, rec := range recs {
		processed, err := h.Handle(ctx, rec)
		if i == 1 {
			if processed || !errors.Is(err, inbox.ErrNoMessageID) {
				t.Fatalf("record without ID: Handle = %v, %v; want false, ErrNoMessageID", processed, err)
			}
			continue
		}
		if processed || err != nil {
			t.Fatalf("record %d: Handle = %v, %v; want false, nil (duplicate)", i, processed, err)
		}
	}
	if err := cl2.CommitMarkedOffsets(ctx); err != nil {
		t.Fatal(err)
	}
	if off := cl2.CommittedOffsets()[topic][0].Offset; off != 3 {
		t.Fatalf("committed offset %d; want 3 (every record marked)", off)
	}
	if got := effectCount(t, db, id); got != 1 {
		t.Fatalf("effect applied %d times; want 1", got)
	}
}

// TestKafkaHandlerErrorNotMarked: a failed record is not marked for commit.
func TestKafkaHandlerErrorNotMarked(t *testing.T) {
	t.Parallel()
	in, db := newInbox(t)
	var marked []*kgo.Record
	h := consume.Kafka[*sql.Tx]{
		Runner:   in,
		Consumer: "billing",
		Handler: func(ctx context.Context, tx *sql.Tx, rec *kgo.Record) error {
			if err := kafkaEffect(ctx, tx, rec); err != nil {
				return err
			}
			return errors.New("boom")
		},
		Marker: markerFunc(func(rs ...*kgo.Record) { marked = append(marked, rs...) }),
	}
	id := outbox.NewID()
	rec := &kgo.Record{Topic: "orders", Headers: []kgo.RecordHeader{{Key: outbox.HeaderID, Value: []byte(id)}}}
	if processed, err := h.Handle(context.Background(), rec); processed || err == nil || err.Error() != "boom" {
		t.Fatalf("Handle = %v, %v; want false, boom", processed, err)
	}
	if len(marked) != 0 {
		t.Fatalf("a failed record was marked for commit")
	}
	if got := effectCount(t, db, id); got != 0 {
		t.Fatalf("the failed handler's effect was kept")
	}
	h.Marker = nil
	if _, err := h.Handle(context.Background(), rec); err == nil || !errorsContain(err, "Kafka.Marker") {
		t.Fatalf("Handle without Marker: err = %v", err)
	}
}

type markerFunc func(...*kgo.Record)

func (f markerFunc) MarkCommitRecords(rs ...*kgo.Record) { f(rs...) }
