package dynamodb

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/aws/smithy-go"

	"github.com/outboxrelay/outbox"
)

// Seq numbers. A record's Seq orders the records of a shard for the relay:
//
//	Seq = UnixMicro(write time) × 1024 + r
//
// where r starts as a random number below 512 and each Store's generator
// makes every Seq it hands out larger than the previous one (it adds one
// when the clock has not moved on or went back). So one Store's writes get
// increasing Seqs, and writes of different Stores (processes) are
// ordered by their clocks to the microsecond, ties broken at random. It
// fits an int64 until the year 2255. DynamoDB has no server-side sequence;
// a counter item per shard would serialise every writer of the shard, so
// the clock it is: per-key order across writer processes holds when their
// clocks agree better than the time between two writes of one key, and a
// record whose Seq lands below a relay's cursor (skew, or a GSI that shows
// it late) is found by Unsettled.
const (
	seqShift  = 10
	seqRandom = 512
)

// seqGen hands out a Store's Seqs.
type seqGen struct {
	mu   sync.Mutex
	last int64
}

// next returns the next Seq for a write at now.
func (g *seqGen) next(now time.Time) int64 {
	seq := now.UnixMicro()<<seqShift | rand.Int64N(seqRandom)
	g.mu.Lock()
	defer g.mu.Unlock()
	if seq <= g.last {
		seq = g.last + 1
	}
	g.last = seq
	return seq
}

// maxSeqAt returns the largest Seq of a write at t (to the microsecond).
func maxSeqAt(t time.Time) int64 { return t.UnixMicro()<<seqShift | (1<<seqShift - 1) }

// SeqTime returns the write time encoded in a Seq.
func SeqTime(seq int64) time.Time { return time.UnixMicro(seq >> seqShift) }

// TopicShard returns the value of the TopicShard attribute: the topic, an
// underscore and the shard number (the ADR's format).
func TopicShard(topic string, shard int) string { return topic + "_" + strconv.Itoa(shard) }

// splitTopicShard parses a TopicShard value.
func splitTopicShard(v string) (topic string, shard int, ok bool) {
	i := strings.LastIndexByte(v, '_')
	if i < 0 {
		return "", 0, false
	}
	n, err := strconv.Atoi(v[i+1:])
	if err != nil {
		return "", 0, false
	}
	return v[:i], n, true
}

func str(s string) types.AttributeValue { return &types.AttributeValueMemberS{Value: s} }
func num(n int64) types.AttributeValue {
	return &types.AttributeValueMemberN{Value: strconv.FormatInt(n, 10)}
}
func micros(t time.Time) types.AttributeValue { return num(t.UnixMicro()) }

func keyOf(id string) map[string]types.AttributeValue {
	return map[string]types.AttributeValue{attrID: str(id)}
}

// getS returns a string attribute ("" when absent).
func getS(item map[string]types.AttributeValue, name string) string {
	if v, ok := item[name].(*types.AttributeValueMemberS); ok {
		return v.Value
	}
	return ""
}

// getN returns a number attribute and whether it is present.
func getN(item map[string]types.AttributeValue, name string) (int64, bool) {
	v, ok := item[name].(*types.AttributeValueMemberN)
	if !ok {
		return 0, false
	}
	n, err := strconv.ParseInt(v.Value, 10, 64)
	if err != nil {
		return 0, false
	}
	return n, true
}

func getTime(item map[string]types.AttributeValue, name string) time.Time {
	if n, ok := getN(item, name); ok {
		return time.UnixMicro(n).UTC()
	}
	return time.Time{}
}

// newItem prepares msg and returns its item (outstanding, shard and Seq
// assigned at now).
func (s *Store) newItem(ctx context.Context, msg *outbox.Message) (map[string]types.AttributeValue, error) {
	if msg == nil {
		return nil, errors.New("dynamodb: Write: nil message")
	}
	if s.opts.Inject != nil {
		msg.Headers = s.opts.Inject(ctx, msg.Headers)
	}
	now := s.opts.Now()
	if err := msg.Prepare(now, s.opts.MaxPayload); err != nil {
		return nil, err
	}
	shard := outbox.PartitionOf(msg.Key, s.opts.Shards)
	seq := s.seq.next(now)
	created := micros(msg.CreatedAt)
	item := map[string]types.AttributeValue{
		attrID:                     str(msg.ID),
		attrTopic:                  str(msg.Topic),
		attrCreatedTime:            created,
		attrOutstandingCreatedTime: created,
		attrShard:                  num(int64(shard)),
		attrTopicShard:             str(TopicShard(msg.Topic, shard)),
		attrSeq:                    num(seq),
		attrOutstandingSeq:         num(seq),
	}
	if len(msg.Payload) > 0 {
		// Absent when empty: older DynamoDB-compatible servers refuse
		// empty binary values.
		item[attrPayload] = &types.AttributeValueMemberB{Value: msg.Payload}
	}
	if msg.Key != "" {
		item[attrKey] = str(msg.Key)
	}
	if len(msg.Headers) > 0 {
		h := make(map[string]types.AttributeValue, len(msg.Headers))
		for k, v := range msg.Headers {
			h[k] = str(v)
		}
		item[attrHeaders] = &types.AttributeValueMemberM{Value: h}
	}
	if size := itemSize(item); size > MaxItemSize {
		return nil, &outbox.ValidationError{Field: "Payload", Reason: fmt.Sprintf(
			"makes a DynamoDB item of %d bytes with the headers and the outbox's attributes; DynamoDB's limit is %d: shrink the payload or headers", size, MaxItemSize)}
	}
	return item, nil
}

// itemSize estimates an item's size as DynamoDB counts it (names plus
// values; numbers counted generously).
func itemSize(item map[string]types.AttributeValue) int {
	n := 0
	for k, v := range item {
		n += len(k) + valueSize(v)
	}
	return n
}

func valueSize(v types.AttributeValue) int {
	switch v := v.(type) {
	case *types.AttributeValueMemberS:
		return len(v.Value)
	case *types.AttributeValueMemberB:
		return len(v.Value)
	case *types.AttributeValueMemberN:
		return 21
	case *types.AttributeValueMemberM:
		n := 3
		for k, e := range v.Value {
			n += len(k) + valueSize(e) + 1
		}
		return n
	}
	return 1
}

// recordOf decodes a message item.
func recordOf(item map[string]types.AttributeValue) (outbox.Record, error) {
	id := getS(item, attrID)
	if err := outbox.ValidateID(id); err != nil {
		return outbox.Record{}, fmt.Errorf("dynamodb: item %q is not an outbox message: %w", id, err)
	}
	r := outbox.Record{Message: outbox.Message{
		ID:        id,
		Topic:     getS(item, attrTopic),
		Key:       getS(item, attrKey),
		CreatedAt: getTime(item, attrCreatedTime),
	}}
	if b, ok := item[attrPayload].(*types.AttributeValueMemberB); ok {
		r.Payload = b.Value
	}
	if m, ok := item[attrHeaders].(*types.AttributeValueMemberM); ok && len(m.Value) > 0 {
		r.Headers = make(map[string]string, len(m.Value))
		for k, v := range m.Value {
			sv, ok := v.(*types.AttributeValueMemberS)
			if !ok {
				// One bad item must not stop the fetch, nor lose a header
				// silently: the relay dead-letters it.
				r.DecodeError = fmt.Sprintf("dynamodb: message %s: header %q is a %T, not a string (S) attribute", id, k, v)
				continue
			}
			r.Headers[k] = sv.Value
		}
	}
	shard, _ := getN(item, attrShard)
	r.Partition = int(shard)
	r.Seq, _ = getN(item, attrSeq)
	attempts, _ := getN(item, attrAttempts)
	r.Attempts = int(attempts)
	r.NextAttemptAt = getTime(item, attrNextAttemptTime)
	r.LastError = getS(item, attrLastError)
	return r, nil
}

// errorCode returns the API error code of err, or "".
func errorCode(err error) string {
	var ae smithy.APIError
	if errors.As(err, &ae) {
		return ae.ErrorCode()
	}
	return ""
}

func isConditionFailed(err error) bool {
	var cf *types.ConditionalCheckFailedException
	return errors.As(err, &cf) || errorCode(err) == "ConditionalCheckFailedException"
}
