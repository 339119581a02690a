package kafka

import (
	"errors"
	"fmt"

	"github.com/outboxrelay/outbox"
)

// Per-key pipelining. The Publisher implements [outbox.KeyPipeliner]: the
// relay may pass up to Options.KeyPipeline messages of one key (to one
// topic) in one Publish call, instead of one, and Kafka writes each only
// after the ones before it.
//
// Publish produces such a run one message at a time: the first at once
// (with every other key's), each next one when the one before it is
// acknowledged (acks=all: written), and none after one that fails. So a
// message is written only after every earlier one of its run was, and
// never when one of them failed: whatever franz-go does on a failure.
// Messages of different keys, and the first of each run, still go out
// together, batched per partition with up to five requests in flight per
// broker; a key's next message follows its acknowledgement inside the
// call, without a round of the relay (handle, settle, build) in between.
// A key still has one message in flight: with a backlog the relay makes
// about a quarter of the Publish calls and two thirds of the settlements,
// but a key moves at one message per acknowledgement, as before.
// (Measured with `outbox bench --scenarios relay/key` against kfake, on a
// loaded 2-core machine: producing a key's run at once drained 10 keys 2.7
// times as fast as one message per key per call, chaining about as fast as
// one per key; with 1,000 keys all three were within the noise.)
//
// Why not produce a key's run all at once, as the idempotent producer
// keeps a partition's order? Because franz-go (v1.22, pkg/kgo) can fail an
// earlier record of a partition and still write a later one: it fails a
// partition's buffered records together (failAllRecords: a non-retriable
// produce error such as an authorisation failure or MESSAGE_TOO_LARGE from
// the broker, the head record's RecordDeliveryTimeout, RecordRetries or
// context, a fatal producer-ID error), then starts the partition afresh
// under a bumped epoch, and a record produced after that is written
// normally. Nothing tells the producer synchronously: the failed records'
// promises run later on another goroutine. So when a partition fails
// between the Produce calls of two messages of a key, the later one is
// written and the earlier one is not (the maintainer describes the same
// race in twmb/franz-go#852). Records too large for ProducerBatchMaxBytes,
// and a Produce that waited for room until its context ended, fail alone
// before they are buffered, with the same effect. With a key's runs fully
// pipelined, the relay's kfake test (a non-retriable error on every fourth
// produce request) saw this in three runs of eight: a message on the
// topic before the earlier message of its key. Chaining on the
// acknowledgement closes it.

// errNotProduced is the result of a message not produced because an
// earlier message of its key and topic in the call failed.
var errNotProduced = errors.New("not produced: an earlier message of the same key and topic in this call failed, and Kafka must not write it first")

// KeyPipeline implements [outbox.KeyPipeliner]: Options.KeyPipeline.
func (p *Publisher) KeyPipeline() int { return p.opts.KeyPipeline }

// runs links each message to the next one of its key and topic in a call.
type runs []int32

// chain links the messages of msgs that have a key, per key and Kafka
// topic, in call order, and fails (not produced) those after a message
// that already failed (errs).
func chain(msgs []*outbox.Message, topics []string, errs []error) runs {
	next := make(runs, 2*len(msgs)) // [2i]: the next of i (-1: none); [2i+1]: 1 if i waits for a predecessor
	var last map[string]int
	var broken map[string]bool
	for i, m := range msgs {
		next[2*i] = -1
		if m.Key == "" {
			continue
		}
		k := topics[i] + "\x00" + m.Key
		if errs[i] == nil && broken[k] {
			errs[i] = fmt.Errorf("kafka: produce to topic %q: %w", topics[i], errNotProduced)
		}
		if errs[i] != nil {
			if broken == nil {
				broken = map[string]bool{}
			}
			broken[k] = true
			continue
		}
		if last == nil {
			last = map[string]int{}
		}
		if j, ok := last[k]; ok {
			next[2*j] = int32(i)
			next[2*i+1] = 1
		}
		last[k] = i
	}
	return next
}

// after returns the message after i in its run, or -1.
func (r runs) after(i int) int { return int(r[2*i]) }

// waits reports whether i waits for the one before it in its run.
func (r runs) waits(i int) bool { return r[2*i+1] == 1 }
