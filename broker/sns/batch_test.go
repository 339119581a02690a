package sns_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/outboxrelay/outbox"
	"github.com/outboxrelay/outbox/broker/internal/awsmsg"
	"github.com/outboxrelay/outbox/broker/sns"
	"github.com/outboxrelay/outbox/internal/backends"
	"github.com/outboxrelay/outbox/internal/testenv"
)

// scripted answers PublishBatch in SNS's query XML as each entry's
// message says ("sender-fault", "throttled", "internal", "silent"; the
// others succeed) and records the forms. goaws has no PublishBatch.
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
	b.WriteString(`<PublishBatchResponse xmlns="http://sns.amazonaws.com/doc/2010-03-31/"><PublishBatchResult><Successful>`)
	var failed strings.Builder
	for i := 1; ; i++ {
		pre := fmt.Sprintf("PublishBatchRequestEntries.member.%d.", i)
		id := r.PostForm.Get(pre + "Id")
		if id == "" {
			break
		}
		fail := func(code string, sender bool) {
			fmt.Fprintf(&failed, `<member><Id>%s</Id><SenderFault>%v</SenderFault><Code>%s</Code><Message>scripted</Message></member>`, id, sender, code)
		}
		switch r.PostForm.Get(pre + "Message") {
		case "sender-fault":
			fail("InvalidParameter", true)
		case "throttled":
			fail("Throttled", false)
		case "internal":
			fail("InternalError", false)
		case "silent":
		default:
			fmt.Fprintf(&b, `<member><Id>%s</Id><MessageId>m-%s</MessageId></member>`, id, id)
		}
	}
	b.WriteString(`</Successful><Failed>` + failed.String() + `</Failed></PublishBatchResult><ResponseMetadata><RequestId>r</RequestId></ResponseMetadata></PublishBatchResponse>`)
	w.Header().Set("Content-Type", "text/xml")
	_, _ = w.Write([]byte(b.String()))
}

// TestPublishBatchWire: PublishBatch requests of at most 10 entries to a
// FIFO topic carry MessageGroupId = the key, MessageDeduplicationId = the
// outbox ID and the attributes; each failed entry is classified alone.
func TestPublishBatchWire(t *testing.T) {
	t.Parallel()
	s := &scripted{}
	srv := httptest.NewServer(s)
	defer srv.Close()
	p := dial(t, nil, sns.Options{Endpoint: srv.URL, FIFO: true})
	var msgs []*outbox.Message
	for i := range 12 {
		msgs = append(msgs, &outbox.Message{ID: outbox.NewID(), Topic: "orders", Key: fmt.Sprintf("k%d", i), Payload: []byte("ok"), CreatedAt: time.Now()})
	}
	for _, body := range []string{"sender-fault", "throttled", "internal", "silent"} {
		msgs = append(msgs, &outbox.Message{ID: outbox.NewID(), Topic: "orders", Key: body, Payload: []byte(body)})
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
	if d, ok := outbox.IsBlocked(errs[13]); !ok || d != "orders" {
		t.Errorf("throttled: %v; want blocked", errs[13])
	}
	if _, ok := outbox.IsBlocked(errs[14]); errs[14] == nil || ok || outbox.IsPermanent(errs[14]) {
		t.Errorf("internal error: %v; want retryable", errs[14])
	}
	if _, ok := outbox.IsBlocked(errs[15]); !ok {
		t.Errorf("unanswered entry: %v; want blocked", errs[15])
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.forms) != 2 {
		t.Fatalf("%d requests for 16 messages; want 2", len(s.forms))
	}
	found := false
	for _, f := range s.forms {
		if f.Get("TopicArn") != "arn:aws:sns:"+testenv.GoAWSRegion+":"+testenv.GoAWSAccount+":orders.fifo" {
			t.Errorf("TopicArn %q", f.Get("TopicArn"))
		}
		for i := 1; i <= 10; i++ {
			pre := fmt.Sprintf("PublishBatchRequestEntries.member.%d.", i)
			if f.Get(pre+"Id") != "0" {
				continue
			}
			found = true
			m := msgs[0]
			if f.Get(pre+"MessageGroupId") != "k0" || f.Get(pre+"MessageDeduplicationId") != m.ID {
				t.Errorf("entry 0: group %q, deduplication ID %q", f.Get(pre+"MessageGroupId"), f.Get(pre+"MessageDeduplicationId"))
			}
			attrs := map[string]string{}
			for j := 1; j <= 10; j++ {
				if name := f.Get(fmt.Sprintf("%sMessageAttributes.entry.%d.Name", pre, j)); name != "" {
					attrs[name] = f.Get(fmt.Sprintf("%sMessageAttributes.entry.%d.Value.StringValue", pre, j))
				}
			}
			if attrs[awsmsg.AttrID] != m.ID || attrs[awsmsg.AttrKey] != "k0" {
				t.Errorf("entry 0: attributes %v", attrs)
			}
		}
	}
	if !found {
		t.Fatal("entry 0 not sent")
	}
}

// TestBackendsScheme: sns:// with the credentials from a shared
// credentials file, the account, a prefix; mistakes are configuration
// errors naming the parameter.
func TestBackendsScheme(t *testing.T) {
	creds := filepath.Join(t.TempDir(), "credentials")
	if err := os.WriteFile(creds, []byte("[default]\naws_access_key_id = AKIDTEST\naws_secret_access_key = file-secret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("AWS_SHARED_CREDENTIALS_FILE", creds)
	t.Setenv("AWS_CONFIG_FILE", filepath.Join(t.TempDir(), "none"))
	t.Setenv("AWS_ACCESS_KEY_ID", "")
	t.Setenv("AWS_SECRET_ACCESS_KEY", "")
	t.Setenv("AWS_EC2_METADATA_DISABLED", "true")
	g := testenv.GoAWSServer(t)
	// A name that round-trips through the topic mapping (prefix "pre.",
	// dots become dashes): the test's server is its own.
	const name = "pre-backends-scheme"
	topicWithQueue(t, g, name)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	p, err := backends.OpenPublisher(ctx, "sns://"+testenv.GoAWSRegion+"?account="+testenv.GoAWSAccount+"&batch_entries=1&prefix=pre.&endpoint="+g.Endpoint(), backends.BrokerOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	const topic = "backends.scheme"
	m := &outbox.Message{ID: outbox.NewID(), Topic: topic, Key: "k", Payload: []byte("hi")}
	if err := p.Publish(ctx, []*outbox.Message{m})[0]; err != nil {
		t.Fatal(err)
	}
	if got := (&reader{g: g, queue: name}).read(t, 1)[0]; got.Attributes[awsmsg.AttrID] != m.ID {
		t.Fatalf("stored %+v; want %s", got, m.ID)
	}
	err = p.Publish(ctx, []*outbox.Message{{ID: outbox.NewID(), Topic: "missing", Payload: []byte("x")}})[0]
	if d, ok := outbox.IsBlocked(err); !ok || d != "missing" || !strings.Contains(err.Error(), "pre-missing") {
		t.Errorf("publish to a missing topic: %v; want it blocked, naming pre-missing", err)
	}
	for _, tc := range []struct{ url, want string }{
		{"sns://eu-west-1?bogus=1", `unknown query parameter "bogus"`},
		{"sns://eu-west-1", "account="},
		{"sns://AKID:secret@eu-west-1?account=123456789012", "credentials"},
		{"sns://eu-west-1?account=12", "Account"},
		{"sns://eu-west-1?account=123456789012&batch_entries=11", "BatchEntries"},
	} {
		_, err := backends.OpenPublisher(ctx, tc.url, backends.BrokerOptions{})
		if !backends.IsConfigError(err) || !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "secret") {
			t.Errorf("OpenPublisher(%q) = %v; want a configuration error containing %q, without the secret", tc.url, err, tc.want)
		}
	}
}
