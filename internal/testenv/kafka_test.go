package testenv_test

import (
	"context"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxrelay/outbox/internal/testenv"
)

// TestKafkaRestartKeepsRecords: a record acknowledged before RestartKafka is
// readable after it, on the same seed addresses.
func TestKafkaRestartKeepsRecords(t *testing.T) {
	seeds, c := testenv.Kafka(t, kfake.SeedTopics(1, "t"))
	if len(seeds) != testenv.KafkaBrokersDefault || c == nil {
		t.Fatalf("Kafka returned %d seeds and cluster %v", len(seeds), c)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	prod, err := kgo.NewClient(kgo.SeedBrokers(seeds...))
	check(t, err, "producer")
	check(t, prod.ProduceSync(ctx, &kgo.Record{Topic: "t", Value: []byte("survives")}).FirstErr(), "produce")
	prod.Close()

	c2 := testenv.RestartKafka(t)
	if got := c2.ListenAddrs(); len(got) != len(seeds) || got[0] != seeds[0] {
		t.Fatalf("after restart the cluster listens on %v; want %v", got, seeds)
	}

	cons, err := kgo.NewClient(kgo.SeedBrokers(seeds...), kgo.ConsumeTopics("t"), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	check(t, err, "consumer")
	defer cons.Close()
	fetches := cons.PollRecords(ctx, 1)
	check(t, fetches.Err(), "poll")
	recs := fetches.Records()
	if len(recs) != 1 || string(recs[0].Value) != "survives" {
		t.Fatalf("after restart read %d records %v; want the one produced before", len(recs), recs)
	}
}

func TestStartKafka(t *testing.T) {
	k, stop, err := testenv.StartKafka(testenv.KafkaOptions{Brokers: 1, Dir: t.TempDir()})
	check(t, err, "StartKafka")
	if len(k.Seeds()) != 1 {
		t.Fatalf("seeds %v; want 1", k.Seeds())
	}
	check(t, stop(), "stop")
	check(t, stop(), "second stop")
	if k.Cluster() != nil {
		t.Fatal("cluster still set after stop")
	}
	if _, err := k.Restart(); err == nil {
		t.Fatal("Restart after stop succeeded")
	}
}
