package sqs_test

import (
	"context"
	"crypto/md5"
	"encoding/hex"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/outboxrelay/outbox"
	"github.com/outboxrelay/outbox/broker/sqs"
	"github.com/outboxrelay/outbox/internal/testenv"
)

// TestSendMessageBatch on goaws: a batch of 25 messages with distinct
// keys (as the relay passes them) to a FIFO queue goes in requests of 10,
// sent concurrently; goaws stores each body with MessageGroupId = the key
// and MessageDeduplicationId = the outbox ID, and drops a second copy of
// an ID. (goaws drops batch entries' message
// attributes: TestBatchWire checks that they are sent.)
func TestSendMessageBatch(t *testing.T) {
	t.Parallel()
	g := testenv.GoAWSServer(t)
	p := dial(t, g, sqs.Options{FIFO: true})
	topic := "batch." + testenv.Name(t)
	queue := p.Queue(topic)
	createQueue(t, g, queue)
	var msgs []*outbox.Message
	for i := range 25 {
		msgs = append(msgs, newMessage(topic, fmt.Sprintf("key-%d", i), fmt.Sprintf("body %d", i)))
	}
	msgs = append(msgs, newMessage(topic, "", "no key"))
	ctx := context.Background()
	for i, err := range p.Publish(ctx, msgs) {
		if err != nil {
			t.Fatalf("message %d: %v", i, err)
		}
	}
	r := &reader{g: g, queue: queue}
	byID := map[string]*outbox.Message{}
	for _, m := range msgs {
		byID[m.ID] = m
	}
	for i, got := range r.read(t, len(msgs)) {
		m := byID[got.DeduplicationID]
		if m == nil {
			t.Fatalf("stored message %d: %+v has an unknown deduplication ID", i, got)
		}
		delete(byID, got.DeduplicationID)
		if got.Body != string(m.Payload) || got.DeduplicationID != m.ID || got.GroupID != sqs.GroupID(m.Key, m.ID) {
			t.Fatalf("stored message %d: %+v; want body %q, group %q, deduplication ID %s", i, got, m.Payload, sqs.GroupID(m.Key, m.ID), m.ID)
		}
	}
	// The same IDs again: acknowledged, and dropped by the queue.
	for i, err := range p.Publish(ctx, msgs[:10]) {
		if err != nil {
			t.Fatalf("again, message %d: %v", i, err)
		}
	}
	marker := newMessage(topic, "key-0", "marker")
	if err := p.Publish(ctx, []*outbox.Message{marker})[0]; err != nil {
		t.Fatal(err)
	}
	if got := r.read(t, 1)[0]; got.Body != "marker" {
		t.Fatalf("after publishing 10 IDs again, the queue holds %q next; want the marker (the copies dropped)", got.Body)
	}
}

// TestGroupID: keys SQS accepts are the group; others a hash of them, one
// per key; no key, the message's own group.
func TestGroupID(t *testing.T) {
	if g := sqs.GroupID("order-1", "id"); g != "order-1" {
		t.Errorf("GroupID(order-1) = %q", g)
	}
	long := strings.Repeat("k", 129)
	for _, k := range []string{"with space", "ключ", long} {
		g := sqs.GroupID(k, "id")
		if !strings.HasPrefix(g, "outbox-sha256-") || len(g) > 128 || g != sqs.GroupID(k, "other") {
			t.Errorf("GroupID(%q) = %q", k, g)
		}
	}
	if g := sqs.GroupID("", "the-id"); g != "the-id" {
		t.Errorf("GroupID of no key = %q", g)
	}
}

// scripted is an HTTP server answering SendMessageBatch in SQS's query
// XML as scripted by each entry's body: "sender-fault" fails with
// InvalidMessageContents (a sender fault), "throttled" with
// RequestThrottled, "internal" with InternalError, "silent" is answered
// neither way; the others succeed. It records every request's form. It
// stands in for SQS where goaws cannot: per-entry failures.
type scripted struct {
	mu    sync.Mutex
	forms []url.Values
}

func (s *scripted) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if err := r.ParseForm(); err != nil {
		http.Error(w, err.Error(), 400)
		return
	}
	s.mu.Lock()
	s.forms = append(s.forms, r.PostForm)
	s.mu.Unlock()
	var b strings.Builder
	b.WriteString(`<SendMessageBatchResponse xmlns="http://queue.amazonaws.com/doc/2012-11-05/"><SendMessageBatchResult>`)
	for i := 1; ; i++ {
		id := r.PostForm.Get(fmt.Sprintf("SendMessageBatchRequestEntry.%d.Id", i))
		if id == "" {
			break
		}
		body := r.PostForm.Get(fmt.Sprintf("SendMessageBatchRequestEntry.%d.MessageBody", i))
		fail := func(code string, sender bool) {
			fmt.Fprintf(&b, `<BatchResultErrorEntry><Id>%s</Id><SenderFault>%v</SenderFault><Code>%s</Code><Message>scripted</Message></BatchResultErrorEntry>`, id, sender, code)
		}
		switch body {
		case "sender-fault":
			fail("InvalidMessageContents", true)
		case "throttled":
			fail("RequestThrottled", false)
		case "internal":
			fail("InternalError", false)
		case "silent":
		default:
			sum := md5.Sum([]byte(body))
			fmt.Fprintf(&b, `<SendMessageBatchResultEntry><Id>%s</Id><MessageId>m-%s</MessageId><MD5OfMessageBody>%s</MD5OfMessageBody></SendMessageBatchResultEntry>`, id, id, hex.EncodeToString(sum[:]))
		}
	}
	b.WriteString(`</SendMessageBatchResult><ResponseMetadata><RequestId>r</RequestId></ResponseMetadata></SendMessageBatchResponse>`)
	w.Header().Set("Content-Type", "text/xml")
	_, _ = w.Write([]byte(b.String()))
}

// TestBatchWire: each batch entry carries the ID, key, creation time and
// headers as message attributes (what goaws drops), a batch request holds
// at most 10 entries, and every failed entry is classified alone: a
// sender fault is permanent, throttling blocks the topic, an internal
// error is retryable, an entry answered neither way is blocked (unknown
// outcome); the other entries of the request succeed.
func TestBatchWire(t *testing.T) {
	t.Parallel()
	s := &scripted{}
	srv := httptest.NewServer(s)
	defer srv.Close()
	p := dial(t, nil, sqs.Options{Endpoint: srv.URL, QueueMapper: func(topic string) string { return srv.URL + "/" + testenv.GoAWSAccount + "/" + topic }})
	var msgs []*outbox.Message
	for i := range 12 {
		m := newMessage("q", fmt.Sprintf("k%d", i), fmt.Sprintf("ok %d", i))
		m.Headers = map[string]string{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}
		msgs = append(msgs, m)
	}
	for _, body := range []string{"sender-fault", "throttled", "internal", "silent"} {
		msgs = append(msgs, newMessage("q", body, body))
	}
	errs := p.Publish(context.Background(), msgs)
	for i := range 12 {
		if errs[i] != nil {
			t.Fatalf("message %d: %v", i, errs[i])
		}
	}
	if !outbox.IsPermanent(errs[12]) {
		t.Errorf("sender fault: %v; want permanent", errs[12])
	}
	if !isBlocked(errs[13], "q") {
		t.Errorf("throttled: %v; want blocked", errs[13])
	}
	if errs[14] == nil || outbox.IsPermanent(errs[14]) || isBlocked(errs[14], "q") {
		t.Errorf("internal error: %v; want retryable", errs[14])
	}
	if !isBlocked(errs[15], "q") {
		t.Errorf("unanswered entry: %v; want blocked", errs[15])
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.forms) != 2 {
		t.Fatalf("%d requests for 16 messages; want 2 (10 entries each at most)", len(s.forms))
	}
	want := map[string]string{}
	for _, f := range s.forms {
		for i := 1; i <= 10; i++ {
			id := f.Get(fmt.Sprintf("SendMessageBatchRequestEntry.%d.Id", i))
			for j := 1; ; j++ {
				pre := fmt.Sprintf("SendMessageBatchRequestEntry.%d.MessageAttribute.%d.", i, j)
				name := f.Get(pre + "Name")
				if name == "" {
					break
				}
				want[id+"/"+name] = f.Get(pre + "Value.StringValue")
			}
		}
	}
	m := msgs[0]
	for name, v := range map[string]string{sqs.AttrID: m.ID, sqs.AttrKey: m.Key, "traceparent": m.Headers["traceparent"], sqs.AttrCreatedAt: m.CreatedAt.UTC().Format(time.RFC3339Nano)} {
		if got := want["0/"+name]; got != v {
			t.Errorf("entry 0: attribute %s = %q; want %q", name, got, v)
		}
	}
}
