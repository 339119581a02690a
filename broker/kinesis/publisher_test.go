package kinesis_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/outboxrelay/outbox"
	"github.com/outboxrelay/outbox/broker/kinesis"
	"github.com/outboxrelay/outbox/internal/testenv"
)

// TestSameKeyInOneCall: several messages of one key in one call (a caller
// other than the relay) are stored in their order, each sent after the
// previous one succeeded, next to other keys' messages; the headers (the
// trace context) travel in the envelope.
func TestSameKeyInOneCall(t *testing.T) {
	t.Parallel()
	k := testenv.KinesaliteServer(t)
	p := dial(t, k, kinesis.Options{})
	topic := "same." + testenv.Name(t)
	createStream(t, k, p.Stream(topic), 1)
	var msgs []*outbox.Message
	for i := range 12 {
		m := newMessage(topic, fmt.Sprintf("k%d", i%3), fmt.Sprint(i))
		m.Headers = map[string]string{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "tracestate": "a=b"}
		msgs = append(msgs, m)
	}
	for i, err := range p.Publish(context.Background(), msgs) {
		if err != nil {
			t.Fatalf("message %d: %v", i, err)
		}
	}
	next := map[string]int{}
	for _, rec := range newReader(k, p.Stream(topic)).read(t, 12) {
		m, err := kinesis.Decode(rec.Data)
		if err != nil {
			t.Fatal(err)
		}
		var i int
		fmt.Sscan(string(m.Payload), &i)
		if i%3 != int(m.Key[1]-'0') || i/3 != next[m.Key] {
			t.Fatalf("key %s: got payload %d, want the key's message %d", m.Key, i, next[m.Key])
		}
		next[m.Key]++
		if m.Headers["traceparent"] != msgs[i].Headers["traceparent"] || m.Headers["tracestate"] != "a=b" || m.Topic != topic || m.ID != msgs[i].ID {
			t.Fatalf("decoded %+v; want the fields of %+v", m, msgs[i])
		}
	}
}

// TestRecordSizeLimit: a record of exactly MaxRecordBytes (envelope,
// payload, partition key) is stored; one byte more fails permanently
// without being sent, and names the limit.
func TestRecordSizeLimit(t *testing.T) {
	t.Parallel()
	k := testenv.KinesaliteServer(t)
	p := dial(t, k, kinesis.Options{})
	topic := "size." + testenv.Name(t)
	createStream(t, k, p.Stream(topic), 1)
	fit := newMessage(topic, "key", "")
	env, err := kinesis.Encode(fit)
	if err != nil {
		t.Fatal(err)
	}
	fit.Payload = bytes.Repeat([]byte("x"), kinesis.MaxRecordBytesDefault-len(env)-len("key"))
	over := newMessage(topic, "other", "")
	over.CreatedAt = fit.CreatedAt
	env, _ = kinesis.Encode(over)
	over.Payload = bytes.Repeat([]byte("y"), kinesis.MaxRecordBytesDefault-len(env)-len("other")+1)
	errs := p.Publish(context.Background(), []*outbox.Message{fit, over})
	if errs[0] != nil {
		t.Fatalf("a record of exactly MaxRecordBytes: %v", errs[0])
	}
	if !outbox.IsPermanent(errs[1]) {
		t.Fatalf("a record one byte over MaxRecordBytes: %v; want a permanent error", errs[1])
	}
	errorContains(t, errs[1], "MaxRecordBytes", over.ID)
	got := received(t, newReader(k, p.Stream(topic)).read(t, 1)[0])
	if got.ID != fit.ID || len(got.Payload) != len(fit.Payload) {
		t.Fatalf("stored %s with %d bytes; want %s", got.ID, len(got.Payload), fit.ID)
	}
}

// TestStreamDeletedAndRecreated: a stream deleted by mistake blocks its
// topic; once recreated, publishing works again.
func TestStreamDeletedAndRecreated(t *testing.T) {
	t.Parallel()
	k := testenv.KinesaliteServer(t)
	p := dial(t, k, kinesis.Options{})
	topic := "del." + testenv.Name(t)
	stream := p.Stream(topic)
	createStream(t, k, stream, 1)
	ctx := context.Background()
	if err := p.Publish(ctx, []*outbox.Message{newMessage(topic, "k", "1")})[0]; err != nil {
		t.Fatal(err)
	}
	deleteStream(t, k, stream)
	err := p.Publish(ctx, []*outbox.Message{newMessage(topic, "k", "2")})[0]
	if !isBlocked(err, topic) {
		t.Fatalf("publish to a deleted stream: %v; want an error blocking the topic", err)
	}
	errorContains(t, err, "does not exist", stream)
	createStream(t, k, stream, 1)
	if err := p.Publish(ctx, []*outbox.Message{newMessage(topic, "k", "3")})[0]; err != nil {
		t.Fatalf("after the stream was recreated: %v", err)
	}
	if got := received(t, newReader(k, stream).read(t, 1)[0]); string(got.Payload) != "3" {
		t.Fatalf("the recreated stream holds %q; want 3", got.Payload)
	}
}

// TestHealth: nil while kinesalite answers, an error while it is stopped,
// nil again once it is back, and ErrClosed after Close. (Not parallel: it
// stops the shared server.)
func TestHealth(t *testing.T) {
	k := testenv.KinesaliteServer(t)
	p := dial(t, k, kinesis.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := p.Health(ctx); err != nil {
		t.Fatalf("Health with the server up: %v", err)
	}
	if err := k.Pause(); err != nil {
		t.Fatal(err)
	}
	err := p.Health(ctx)
	if rerr := k.Resume(ctx); rerr != nil {
		t.Fatal(rerr)
	}
	if err == nil {
		t.Fatal("Health with the server stopped: nil, want an error")
	}
	if err := p.Health(ctx); err != nil {
		t.Fatalf("Health after the server came back: %v", err)
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if err := p.Health(ctx); !errors.Is(err, outbox.ErrClosed) {
		t.Fatalf("Health after Close: %v, want ErrClosed", err)
	}
}

// scripted is a Kinesis endpoint whose PutRecords answers a test writes:
// kinesalite never throttles, has no IAM and never fails a record.
type scripted struct {
	*httptest.Server
	mu       sync.Mutex
	requests [][]putRecord // each PutRecords request's records
}

type putRecord struct {
	Data         []byte
	PartitionKey string
}

// answer is a scripted answer: a request-level error (status and __type),
// or per-record error codes ("" for success) by partition key.
type answer struct {
	status  int
	errType string
	record  map[string]string
	hang    bool // never answer (until the client gives up)
	hangup  bool // close the connection without an answer
}

func newScripted(t *testing.T, answers func(n int, recs []putRecord) answer) *scripted {
	s := &scripted{}
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var in struct {
			Records []putRecord
		}
		if err := json.NewDecoder(r.Body).Decode(&in); err != nil || r.Header.Get("X-Amz-Target") != "Kinesis_20131202.PutRecords" {
			http.Error(w, "scripted: PutRecords only", http.StatusBadRequest)
			return
		}
		s.mu.Lock()
		s.requests = append(s.requests, in.Records)
		n := len(s.requests)
		s.mu.Unlock()
		a := answers(n, in.Records)
		switch {
		case a.hang:
			<-r.Context().Done()
			return
		case a.hangup:
			conn, _, err := w.(http.Hijacker).Hijack()
			if err == nil {
				conn.Close()
			}
			return
		case a.status != 0:
			w.Header().Set("Content-Type", "application/x-amz-json-1.1")
			w.WriteHeader(a.status)
			fmt.Fprintf(w, `{"__type":%q,"message":"scripted"}`, a.errType)
			return
		}
		type result struct {
			SequenceNumber, ShardId, ErrorCode, ErrorMessage string `json:",omitempty"`
		}
		out := struct {
			FailedRecordCount int
			Records           []result
		}{}
		for i, rec := range in.Records {
			if code := a.record[rec.PartitionKey]; code != "" {
				out.FailedRecordCount++
				out.Records = append(out.Records, result{ErrorCode: code, ErrorMessage: "scripted"})
			} else {
				out.Records = append(out.Records, result{SequenceNumber: fmt.Sprint(1000 + i), ShardId: "shardId-000000000000"})
			}
		}
		w.Header().Set("Content-Type", "application/x-amz-json-1.1")
		json.NewEncoder(w).Encode(out)
	}))
	t.Cleanup(s.Close)
	return s
}

func (s *scripted) sent() [][]string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out [][]string
	for _, req := range s.requests {
		var keys []string
		for _, r := range req {
			keys = append(keys, r.PartitionKey)
		}
		out = append(out, keys)
	}
	return out
}

func dialScripted(t *testing.T, s *scripted, opts kinesis.Options) *kinesis.Publisher {
	t.Helper()
	opts.AWS = awsConfig()
	opts.AWS.HTTPClient = &http.Client{Transport: &http.Transport{}}
	opts.Endpoint = s.URL
	p, err := kinesis.Dial(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close(); opts.AWS.HTTPClient.(*http.Client).CloseIdleConnections() })
	return p
}

// TestRecordFailureHoldsItsKey: a record that fails inside PutRecords
// (throughput exceeded, an internal failure) is reported, the other keys'
// records of the request are delivered, and the failed key's later
// messages in the call are not sent at all: they fail too (blocked like
// it, or retryable), so that the relay sends them again after it, in
// order.
func TestRecordFailureHoldsItsKey(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		code    string
		blocked bool
	}{
		{"ProvisionedThroughputExceededException", true},
		{"InternalFailure", false},
		{"KMSThrottlingException", true},
	} {
		t.Run(tc.code, func(t *testing.T) {
			s := newScripted(t, func(n int, _ []putRecord) answer { return answer{record: map[string]string{"a": tc.code}} })
			p := dialScripted(t, s, kinesis.Options{})
			msgs := []*outbox.Message{newMessage("t", "a", "a1"), newMessage("t", "b", "b1"), newMessage("t", "a", "a2"), newMessage("t", "b", "b2")}
			errs := p.Publish(context.Background(), msgs)
			if errs[1] != nil || errs[3] != nil {
				t.Fatalf("key b: %v, %v; want both delivered", errs[1], errs[3])
			}
			for _, i := range []int{0, 2} {
				if errs[i] == nil || outbox.IsPermanent(errs[i]) {
					t.Fatalf("message %d of key a: %v; want a non-permanent error", i, errs[i])
				}
				if _, blocked := outbox.IsBlocked(errs[i]); blocked != tc.blocked {
					t.Errorf("message %d of key a: %v; blocked = %v, want %v", i, errs[i], blocked, tc.blocked)
				}
			}
			errorContains(t, errs[0], tc.code)
			errorContains(t, errs[2], "not sent", msgs[0].ID)
			if got, want := fmt.Sprint(s.sent()), "[[a b] [b]]"; got != want {
				t.Fatalf("requests (partition keys): %s; want %s (a2 never sent)", got, want)
			}
		})
	}
}

// TestClassification: how each request-level answer is reported.
func TestClassification(t *testing.T) {
	t.Parallel()
	const blocked, permanent, retryable = "blocked", "permanent", "retryable"
	for _, tc := range []struct {
		name string
		a    answer
		want string
		text string
	}{
		{"stream missing", answer{status: 400, errType: "ResourceNotFoundException"}, blocked, "does not exist"},
		{"stream not active", answer{status: 400, errType: "ResourceInUseException"}, blocked, "ACTIVE"},
		{"access denied", answer{status: 400, errType: "AccessDeniedException"}, blocked, "kinesis:PutRecords"},
		{"KMS access denied", answer{status: 400, errType: "KMSAccessDeniedException"}, blocked, "access denied"},
		{"credentials refused", answer{status: 400, errType: "UnrecognizedClientException"}, blocked, "credentials"},
		{"throttled", answer{status: 400, errType: "ProvisionedThroughputExceededException"}, blocked, "throttled"},
		{"limit exceeded", answer{status: 400, errType: "LimitExceededException"}, blocked, "throttled"},
		{"unavailable", answer{status: 503, errType: "ServiceUnavailable"}, blocked, "unavailable"},
		{"connection closed", answer{hangup: true}, blocked, "connection closed"},
		{"invalid", answer{status: 400, errType: "InvalidArgumentException"}, permanent, "invalid"},
		{"internal failure", answer{status: 500, errType: "InternalFailure"}, retryable, "InternalFailure"},
		{"no answer in time", answer{hang: true}, retryable, "no answer in time"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := newScripted(t, func(int, []putRecord) answer { return tc.a })
			p := dialScripted(t, s, kinesis.Options{PublishTimeout: 500 * time.Millisecond})
			err := p.Publish(context.Background(), []*outbox.Message{newMessage("orders", "k", "x")})[0]
			var got string
			switch _, isBlocked := outbox.IsBlocked(err); {
			case err == nil:
				t.Fatal("no error")
			case isBlocked:
				got = blocked
			case outbox.IsPermanent(err):
				got = permanent
			default:
				got = retryable
			}
			if got != tc.want {
				t.Errorf("%v: %s, want %s", err, got, tc.want)
			}
			errorContains(t, err, tc.text, `"orders"`)
		})
	}
}

// TestInvalidBatchFindsItsRecord: a request refused as invalid as a whole
// (Kinesis stored none of it) is sent again record by record, so that only
// the record at fault fails, permanently.
func TestInvalidBatchFindsItsRecord(t *testing.T) {
	t.Parallel()
	s := newScripted(t, func(n int, recs []putRecord) answer {
		for _, r := range recs {
			if r.PartitionKey == "bad" {
				return answer{status: 400, errType: "ValidationException"}
			}
		}
		return answer{}
	})
	p := dialScripted(t, s, kinesis.Options{})
	errs := p.Publish(context.Background(), []*outbox.Message{newMessage("t", "a", "1"), newMessage("t", "bad", "2"), newMessage("t", "c", "3")})
	if errs[0] != nil || errs[2] != nil || !outbox.IsPermanent(errs[1]) {
		t.Fatalf("results %v; want only the second to fail, permanently", errs)
	}
	if got, want := fmt.Sprint(s.sent()), "[[a bad c] [a] [bad] [c]]"; got != want {
		t.Fatalf("requests: %s; want %s", got, want)
	}
}

// TestBatchLimits: requests hold at most MaxBatchRecords records and 5 MiB.
func TestBatchLimits(t *testing.T) {
	t.Parallel()
	s := newScripted(t, func(int, []putRecord) answer { return answer{} })
	p := dialScripted(t, s, kinesis.Options{MaxBatchRecords: 3, MaxConcurrentRequests: 1, PublishTimeout: 2 * time.Minute})
	var msgs []*outbox.Message
	for i := range 7 {
		msgs = append(msgs, newMessage("t", fmt.Sprint(i), "x"))
	}
	big := strings.Repeat("b", 900<<10) // 6 of them: 5.3 MiB
	for i := range 6 {
		msgs = append(msgs, newMessage("u", fmt.Sprint("big", i), big))
	}
	for i, err := range p.Publish(context.Background(), msgs) {
		if err != nil {
			t.Fatalf("message %d: %v", i, err)
		}
	}
	if got, want := fmt.Sprint(s.sent()), "[[0 1 2] [3 4 5] [6] [big0 big1 big2] [big3 big4 big5]]"; got != want {
		t.Fatalf("requests: %s; want %s", got, want)
	}
	p2 := dialScripted(t, s, kinesis.Options{MaxConcurrentRequests: 1, PublishTimeout: 2 * time.Minute})
	s.mu.Lock()
	s.requests = nil
	s.mu.Unlock()
	for i, err := range p2.Publish(context.Background(), msgs[7:]) {
		if err != nil {
			t.Fatalf("message %d: %v", i, err)
		}
	}
	if got, want := fmt.Sprint(s.sent()), "[[big0 big1 big2 big3 big4] [big5]]"; got != want {
		t.Fatalf("requests of 900 KiB records: %s; want %s (5 MiB each at most)", got, want)
	}
}

// TestStreamMapper: a topic mapped to a stream ARN is sent with StreamARN;
// one mapped to an invalid name fails permanently, naming the topic.
func TestStreamMapper(t *testing.T) {
	t.Parallel()
	s := newScripted(t, func(int, []putRecord) answer { return answer{} })
	p := dialScripted(t, s, kinesis.Options{StreamMapper: func(topic string) string {
		if topic == "arn" {
			return "arn:aws:kinesis:us-east-1:123456789012:stream/orders"
		}
		return "bad name/" + topic
	}})
	errs := p.Publish(context.Background(), []*outbox.Message{newMessage("arn", "k", "1"), newMessage("x", "k2", "2")})
	if errs[0] != nil {
		t.Fatalf("ARN: %v", errs[0])
	}
	if !outbox.IsPermanent(errs[1]) {
		t.Fatalf("invalid stream: %v; want permanent", errs[1])
	}
	errorContains(t, errs[1], `topic "x"`, "StreamMapper")
}

// TestPartitionKey: the key as is when Kinesis takes it, its hash when too
// long, the ID without key.
func TestPartitionKey(t *testing.T) {
	long := strings.Repeat("é", 257)
	for _, tc := range []struct{ key, want string }{
		{"order-7", "order-7"},
		{strings.Repeat("é", 256), strings.Repeat("é", 256)},
		{"", "ID"},
	} {
		if got := kinesis.PartitionKey(tc.key, "ID"); got != tc.want {
			t.Errorf("PartitionKey(%q) = %q, want %q", tc.key, got, tc.want)
		}
	}
	if got := kinesis.PartitionKey(long, "ID"); !strings.HasPrefix(got, "outbox-sha256-") || len(got) != 78 || got != kinesis.PartitionKey(long, "other") {
		t.Errorf("PartitionKey of 257 characters = %q; want a stable outbox-sha256- hash", got)
	}
}

// TestEnvelope: Encode and Decode round-trip every field, the payload
// byte for byte (newlines and invalid UTF-8 included); Decode refuses
// what is not an envelope.
func TestEnvelope(t *testing.T) {
	m := &outbox.Message{ID: outbox.NewID(), Topic: "a.b", Key: "k\n\"<&>", Payload: []byte("line1\nline2\xff"),
		Headers: map[string]string{"traceparent": "00-1-2-01", "x": "\n"}, CreatedAt: time.Date(2026, 1, 2, 3, 4, 5, 6, time.UTC)}
	data, err := kinesis.Encode(m)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.HasPrefix(data, []byte(`{"outbox":1,"id":"`+m.ID+`","topic":"a.b","key":"k\n\"<&>"`)) {
		t.Errorf("envelope starts %q", data[:80])
	}
	got, err := kinesis.Decode(data)
	if err != nil {
		t.Fatal(err)
	}
	if got.ID != m.ID || got.Topic != m.Topic || got.Key != m.Key || !bytes.Equal(got.Payload, m.Payload) || !got.CreatedAt.Equal(m.CreatedAt) ||
		fmt.Sprint(got.Headers) != fmt.Sprint(m.Headers) {
		t.Fatalf("decoded %+v; want %+v", got, m)
	}
	for _, bad := range []string{"", "payload only", `{"outbox":2,"id":"x"}` + "\n", `{"outbox":1}` + "\n", `{"outbox":1,"id":"x","extra":1}` + "\n"} {
		if _, err := kinesis.Decode([]byte(bad)); err == nil {
			t.Errorf("Decode(%q): no error", bad)
		}
	}
	if _, err := kinesis.Encode(&outbox.Message{ID: "x", Key: "\xff"}); err == nil {
		t.Error("Encode of a key that is not UTF-8: no error")
	}
}

func FuzzDecode(f *testing.F) {
	data, _ := kinesis.Encode(&outbox.Message{ID: "id", Topic: "t", Key: "k", Payload: []byte("p"), Headers: map[string]string{"h": "v"}})
	f.Add(data)
	f.Add([]byte("{}\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		m, err := kinesis.Decode(data)
		if err != nil {
			return
		}
		again, err := kinesis.Encode(m)
		if err != nil {
			return // a decoded key or header may hold U+FFFD-free invalid text: not ours to write
		}
		m2, err := kinesis.Decode(again)
		if err != nil || m2.ID != m.ID || m2.Key != m.Key || !bytes.Equal(m2.Payload, m.Payload) {
			t.Fatalf("re-encoding %q: %v, %+v", data, err, m2)
		}
	})
}
