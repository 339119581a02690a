package kafka

import (
	"errors"
	"fmt"

	"github.com/twmb/franz-go/pkg/kbin"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxrelay/outbox"
)

// Per-key pipelining: the Publisher implements [outbox.KeyPipeliner], so
// the relay may pass several messages of one key (to one topic) in one
// Publish call. It promises that such a message is written by the brokers
// only after every earlier one of its key and topic in the call was. Why
// that holds, from franz-go's producer (v1.22, pkg/kgo sink.go and
// producer.go), with idempotence on (required, see pipelineSafe):
//
//  1. A key goes to one partition (the default partitioner hashes the key),
//     and Publish calls Produce for a call's messages in order, from one
//     goroutine: a key's records enter the partition's buffer in order.
//  2. A partition's records are sent, acknowledged and promised in buffer
//     order; with idempotence the broker writes a batch only if it carries
//     the next sequence number (OUT_OF_ORDER_SEQUENCE_NUMBER otherwise, which
//     franz-go answers by resending in order under a new epoch), so a
//     dropped connection or a retryable error (NOT_LEADER, REQUEST_TIMED_OUT,
//     ...) resends and never reorders, and up to five requests per broker
//     may be in flight.
//  3. franz-go fails a buffered record only through failAllRecords, which
//     fails every record buffered for the partition at that moment, later
//     ones included, and bumps the epoch: a non-retryable error for a batch
//     (finishBatch: MESSAGE_TOO_LARGE, INVALID_RECORD, authorisation, ...),
//     the head record's RecordDeliveryTimeout or RecordRetries, the head
//     record's context ending, a fatal producer-ID error, Close. A batch
//     that may have been written (sent, outcome unknown) is never failed by
//     a timeout, a retry count or a context with idempotence: it is resent
//     until its outcome is known. Unknown or unauthorised topics fail the
//     whole topic's buffer the same way.
//  4. Some records fail before they are buffered, alone, and a later
//     record of the same partition is then buffered and may be written:
//     a record too large for ProducerBatchMaxBytes (or MaxBufferedBytes),
//     and a Produce that waited for room (MaxBufferedRecords) until its
//     context ended. Publish therefore checks every record's size before
//     producing any (precheck: a record too large fails permanently and the
//     later records of its key in the call are not produced), never lets
//     Produce wait (it reserves room for the call first: room, with
//     franz-go's own bound one above it, so franz-go's count, at most ours
//     plus the one record whose promise is running, never reaches it), and
//     stops producing once ctx has ended.
//
// The one case left: a failAllRecords (3) that runs on another goroutine
// after Produce buffered a key's record and before it buffers the next one
// of the key in the same call. The next record then starts a new buffer and
// may be written although the earlier one was not. It needs the earlier
// record's partition to fail in the microseconds between two Produce calls
// of one loop (a broker's refusal, or a DeliveryTimeout or another call's
// context ending for records ahead of it in the partition). franz-go offers
// no way to close that window from outside; Publish detects it afterwards
// (checkOrder logs it at ERROR) and the relay, which never settles a later
// message of a key after an earlier one failed, publishes the later one
// again after the earlier (the stream then shows it once before and once
// after). With KeyPipeline 1 the relay passes one message per key per call
// and the case cannot arise.

// errNotProduced is the result of a message not produced because an
// earlier message of its key in the call failed: its turn comes after it.
var errNotProduced = errors.New("kafka: not produced: an earlier message of the same key and topic in this call failed, and Kafka must not write it first")

// runKey identifies a message's key and Kafka topic ("" for no key: no
// order to keep).
func runKey(topic string, m *outbox.Message) string {
	if m.Key == "" {
		return ""
	}
	return topic + "\x00" + m.Key
}

// recordBatchOverhead is the wire size of a Kafka record batch holding no
// records (as franz-go counts it).
const recordBatchOverhead = 4 + 8 + 4 + 4 + 1 + 4 + 2 + 4 + 8 + 8 + 8 + 2 + 4 + 4

// batchBytes is the size franz-go checks against ProducerBatchMaxBytes
// before buffering r as the first record of a new batch (recBatch.tryBuffer
// with an unknown produce version: the largest of the v2 batch and its
// flexible encoding; a record that fits no new batch fails with
// MESSAGE_TOO_LARGE). Once the version is known franz-go's figure may be up
// to three bytes smaller, so a record within three bytes of the limit may
// be refused here that franz-go would take.
func batchBytes(r *kgo.Record) int64 {
	l := 1 + // attributes
		kbin.VarlongLen(0) + // timestamp delta
		kbin.VarintLen(0) + // offset delta
		kbin.VarintLen(int32(len(r.Key))) + len(r.Key) +
		kbin.VarintLen(int32(len(r.Value))) + len(r.Value) +
		kbin.VarintLen(int32(len(r.Headers)))
	for _, h := range r.Headers {
		l += kbin.VarintLen(int32(len(h.Key))) + len(h.Key) + kbin.VarintLen(int32(len(h.Value))) + len(h.Value)
	}
	wire := int64(recordBatchOverhead + kbin.VarintLen(int32(l)) + l)
	batchLen := wire - 4
	flexible := int64(kbin.UvarintLen(uint32(batchLen)+1)) + batchLen
	return max(wire, flexible)
}

// precheck fails, before anything is produced, the records franz-go would
// fail alone before buffering them (too large), and marks the messages
// after a failed one of the same key and topic as not produced. recs[i]
// is nil for a message already failed.
func (p *Publisher) precheck(msgs []*outbox.Message, topics []string, recs []*kgo.Record, errs []error) {
	var broken map[string]bool
	for i, r := range recs {
		k := runKey(topics[i], msgs[i])
		if errs[i] == nil && broken[k] && k != "" {
			errs[i] = errNotProduced
		}
		if errs[i] == nil {
			if size, limit := batchBytes(r), p.batchLimit(topics[i]); size > limit {
				errs[i] = outbox.Permanent(fmt.Errorf("kafka: produce to topic %q: message %s is %d bytes as a record batch (payload %d bytes, key %d bytes, plus headers), more than the producer's batch limit of %d (MaxMessageBytes): shrink it, or raise MaxMessageBytes and the broker's message.max.bytes: %w",
					topics[i], msgs[i].ID, size, len(msgs[i].Payload), len(msgs[i].Key), limit, kerr.MessageTooLarge))
			}
		}
		if errs[i] != nil {
			recs[i] = nil
			if k != "" {
				if broken == nil {
					broken = map[string]bool{}
				}
				broken[k] = true
			}
		}
	}
}

// batchLimit is franz-go's ProducerBatchMaxBytes for topic.
func (p *Publisher) batchLimit(topic string) int64 {
	if p.batchMax != nil {
		return int64(p.batchMax(topic))
	}
	return int64(p.opts.MaxMessageBytes)
}

// pipelineSafe reports whether the client's options keep the promise above:
// idempotent writes, no byte bound on the buffer (Produce could wait for
// room), no manual flushing, and franz-go's record bound above the room
// Publish reserves. ClientOptions may have changed any of them.
func pipelineSafe(client *kgo.Client, opts Options) bool {
	disabled, ok1 := client.OptValue(kgo.DisableIdempotentWrite).(bool)
	manual, ok2 := client.OptValue(kgo.ManualFlushing).(bool)
	maxBytes, ok3 := client.OptValue(kgo.MaxBufferedBytes).(int64)
	maxRecs, ok4 := client.OptValue(kgo.MaxBufferedRecords).(int64)
	return ok1 && ok2 && ok3 && ok4 && !disabled && !manual && maxBytes <= 0 && maxRecs > int64(opts.MaxBufferedRecords)
}

// KeyPipeline implements [outbox.KeyPipeliner]: Options.KeyPipeline, or 1
// when ClientOptions made pipelining unsafe (see pipelineSafe).
func (p *Publisher) KeyPipeline() int {
	if !p.pipelined {
		return 1
	}
	return p.opts.KeyPipeline
}

// checkOrder logs the case the Publisher cannot prevent (see above): a
// message acknowledged after an earlier one of its key and topic in the
// call failed.
func (p *Publisher) checkOrder(msgs []*outbox.Message, topics []string, errs []error) {
	var failed map[string]int
	for i, err := range errs {
		k := runKey(topics[i], msgs[i])
		if k == "" {
			continue
		}
		if err != nil {
			if failed == nil {
				failed = map[string]int{}
			}
			if _, ok := failed[k]; !ok {
				failed[k] = i
			}
			continue
		}
		if j, ok := failed[k]; ok {
			p.opts.Logger.Error("kafka: a message was acknowledged after an earlier message of its key failed in the same call (its partition failed between the two Produce calls); the relay publishes it again after the earlier one",
				"topic", topics[i], "key", msgs[i].Key, "id", msgs[i].ID, "earlier_id", msgs[j].ID, "earlier_err", errs[j])
		}
	}
}
