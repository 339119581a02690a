package kafka_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/outboxrelay/outbox"
	"github.com/outboxrelay/outbox/broker/kafka"
	"github.com/outboxrelay/outbox/internal/memstore"
	"github.com/outboxrelay/outbox/internal/relaytest"
	"github.com/outboxrelay/outbox/internal/testenv"
)

// runCounter wraps a Publisher and records the most messages of one key
// seen in one call: evidence that the relay pipelined.
type runCounter struct {
	*kafka.Publisher
	maxRun atomic.Int64
}

func (c *runCounter) Publish(ctx context.Context, msgs []*outbox.Message) []error {
	run := map[string]int64{}
	for _, m := range msgs {
		if run[m.Key]++; run[m.Key] > c.maxRun.Load() {
			c.maxRun.Store(run[m.Key])
		}
	}
	return c.Publisher.Publish(ctx, msgs)
}

// failProduce answers a produce request with code for every partition in
// it, without writing anything.
func failProduce(req *kmsg.ProduceRequest, code int16) *kmsg.ProduceResponse {
	resp := req.ResponseKind().(*kmsg.ProduceResponse)
	resp.Version = req.Version
	for _, rt := range req.Topics {
		st := kmsg.NewProduceResponseTopic()
		st.Topic, st.TopicID = rt.Topic, rt.TopicID
		for _, rp := range rt.Partitions {
			sp := kmsg.NewProduceResponseTopicPartition()
			sp.Partition = rp.Partition
			sp.ErrorCode = code
			sp.BaseOffset = -1
			st.Partitions = append(st.Partitions, sp)
		}
		resp.Topics = append(resp.Topics, st)
	}
	return resp
}

// The relay passes up to KeyPipeline messages of a key per call to Kafka
// while produce requests fail: with an error Kafka calls retriable (which
// franz-go retries itself, in order), with a non-retriable one (which fails
// the partition's buffered records, and the relay retries them), or with
// the connection dropped before the broker answers. The topic must hold
// every message, each key in its written order, with duplicates only as
// whole redeliveries of a suffix of the key. (With a key's messages
// produced all at once instead of each after the acknowledgement of the
// one before, the non-retriable case put a message before the earlier one
// of its key in three runs of eight: see pipeline.go.)
func TestRelayPipelinedKeysUnderProduceFaults(t *testing.T) {
	for _, tc := range []struct {
		name  string
		fault func(*kmsg.ProduceRequest) (kmsg.Response, error)
	}{
		{"retriable", func(req *kmsg.ProduceRequest) (kmsg.Response, error) {
			return failProduce(req, kerr.NotLeaderForPartition.Code), nil
		}},
		{"not-retriable", func(req *kmsg.ProduceRequest) (kmsg.Response, error) {
			return failProduce(req, kerr.PolicyViolation.Code), nil
		}},
		{"dropped-connection", func(*kmsg.ProduceRequest) (kmsg.Response, error) {
			return nil, errors.New("injected: connection dropped")
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			seeds, cluster := testenv.Kafka(t)
			topic := "pipe-" + tc.name
			createTopic(t, seeds, prefixed(topic), 4)

			st := memstore.New(8, nil)
			written := map[string][]string{}
			var msgs []outbox.Message
			const n, keys = 3000, 30
			for i := range n {
				k := fmt.Sprintf("k%d", i%keys)
				m := outbox.Message{ID: outbox.NewID(), Topic: topic, Key: k, Payload: []byte(strconv.Itoa(i))}
				msgs = append(msgs, m)
				written[k] = append(written[k], m.ID)
			}
			if err := st.Write(context.Background(), msgs...); err != nil {
				t.Fatal(err)
			}

			// Every 4th produce request fails, 60 times.
			var reqs, faults atomic.Int64
			cluster.ControlKey(int16(kmsg.Produce), func(r kmsg.Request) (kmsg.Response, error, bool) {
				cluster.KeepControl()
				if reqs.Add(1)%4 != 0 || faults.Load() >= 60 {
					return nil, nil, false
				}
				faults.Add(1)
				resp, err := tc.fault(r.(*kmsg.ProduceRequest))
				return resp, err, true
			})

			pub := &runCounter{Publisher: dial(t, kafka.Options{Brokers: seeds, TopicMapper: prefixed, KeyPipeline: 8})}
			cfg := outbox.Config{
				Workers: 4, BatchSize: 64, PublishTimeout: 10 * time.Second,
				PollInterval: 10 * time.Millisecond, SweepInterval: 20 * time.Millisecond,
				BackoffMin: time.Millisecond, BackoffMax: 20 * time.Millisecond, MaxAttempts: 1000,
			}
			r := relaytest.Start(t, st, pub, cfg)
			relaytest.WaitFor(t, "the relay to publish every message", 60*time.Second, func() bool { return st.Outstanding() == 0 })
			if err := r.Stop(); err != nil {
				t.Fatal(err)
			}
			stats := r.Stats()
			if tc.name == "not-retriable" && stats.Failed == 0 {
				t.Fatal("no publish failed: franz-go did not fail the refused records")
			}
			if d := st.Dead(); len(d) != 0 {
				t.Fatalf("%d dead letters, first %+v", len(d), d[0])
			}
			if faults.Load() == 0 {
				t.Fatal("no fault injected")
			}
			if pub.maxRun.Load() < 2 {
				t.Fatalf("at most %d message of a key per call: no pipelining", pub.maxRun.Load())
			}
			got := readAll(t, seeds, prefixed(topic))
			dups := checkKeyStreams(t, written, got)
			t.Logf("%d produce requests, %d failed; up to %d messages of a key per call; relay: %d failed attempts, %d blocked; %d records, %d redelivered",
				reqs.Load(), faults.Load(), pub.maxRun.Load(), stats.Failed, stats.Blocked, len(got), dups)
		})
	}
}

// readAll reads every record of kafkaTopic, up to its end offsets.
func readAll(t *testing.T, seeds []string, kafkaTopic string) []*kgo.Record {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ends, err := kadm.NewClient(client(t, seeds)).ListEndOffsets(ctx, kafkaTopic)
	if err != nil {
		t.Fatal(err)
	}
	total := 0
	ends.Each(func(o kadm.ListedOffset) { total += int(o.Offset) })
	return newReader(t, seeds, kafkaTopic).read(t, total)
}

// checkKeyStreams checks each key's records, in the order its partition
// holds them: the written order, every message present, duplicates only as
// whole redeliveries of a suffix (a redelivery starts at an earlier message
// and goes on in order to the end). It returns the redelivered records.
func checkKeyStreams(t *testing.T, written map[string][]string, got []*kgo.Record) (dups int) {
	t.Helper()
	index := map[string]int{}
	for _, ids := range written {
		for i, id := range ids {
			index[id] = i
		}
	}
	next := map[string]int{}
	for _, r := range got {
		var id string
		for _, h := range r.Headers {
			if h.Key == outbox.HeaderID {
				id = string(h.Value)
			}
		}
		key := string(r.Key)
		i, ok := index[id]
		if !ok {
			t.Fatalf("record %q of key %q was never written", id, key)
		}
		switch due := next[key]; {
		case i == due:
		case i < due:
			dups++
		default:
			t.Fatalf("key %q: partition %d offset %d holds #%d when #%d was due: a gap or a reorder", key, r.Partition, r.Offset, i, due)
		}
		next[key] = i + 1
	}
	for k, ids := range written {
		if next[k] != len(ids) {
			t.Fatalf("key %q: its stream ends at #%d of %d (lost, or a redelivery stopped short)", k, next[k], len(ids))
		}
	}
	return dups
}

// A message that fails (too large) stops its key in the call: the later
// messages of the key are not produced (retryable), other keys go on, and
// the topic holds nothing of the key past the gap.
func TestKeyRunStopsAtMessageNotProduced(t *testing.T) {
	seeds, _ := testenv.Kafka(t)
	createTopic(t, seeds, "runs", 1)
	p := dial(t, kafka.Options{Brokers: seeds, MaxMessageBytes: 4096})
	msgs := []*outbox.Message{
		newMessage("runs", "a", "a1"),
		newMessage("runs", "b", "b1"),
		newMessage("runs", "a", strings.Repeat("x", 5000)),
		newMessage("runs", "a", "a3"),
		newMessage("runs", "b", "b2"),
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	errs := p.Publish(ctx, msgs)
	if errs[0] != nil || errs[1] != nil || errs[4] != nil {
		t.Fatalf("the valid messages failed: %v", errs)
	}
	if !outbox.IsPermanent(errs[2]) {
		t.Fatalf("the message too large: %v; want a permanent error", errs[2])
	}
	errorContains(t, errs[2], "MaxMessageBytes")
	if _, blocked := outbox.IsBlocked(errs[3]); errs[3] == nil || outbox.IsPermanent(errs[3]) || blocked {
		t.Fatalf("the message after it: %v; want a retryable error", errs[3])
	}
	errorContains(t, errs[3], "earlier message")
	var got []string
	for _, r := range newReader(t, seeds, "runs").read(t, 3) {
		got = append(got, string(r.Value))
	}
	if strings.Join(got, " ") != "a1 b1 b2" {
		t.Fatalf("topic holds %v, want [a1 b1 b2]", got)
	}
}
