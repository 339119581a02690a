package sqs_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/outboxrelay/outbox"
	"github.com/outboxrelay/outbox/broker/sqs"
	"github.com/outboxrelay/outbox/internal/backends"
	"github.com/outboxrelay/outbox/internal/testenv"
)

// awsEnv points the AWS configuration chain at a credentials file (the
// secret in a file, not the environment) and no instance metadata.
func awsEnv(t *testing.T) {
	creds := filepath.Join(t.TempDir(), "credentials")
	if err := os.WriteFile(creds, []byte("[relay]\naws_access_key_id = AKIDTEST\naws_secret_access_key = file-secret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("AWS_SHARED_CREDENTIALS_FILE", creds)
	t.Setenv("AWS_CONFIG_FILE", filepath.Join(t.TempDir(), "none"))
	t.Setenv("AWS_ACCESS_KEY_ID", "")
	t.Setenv("AWS_SECRET_ACCESS_KEY", "")
	t.Setenv("AWS_PROFILE", "")
	t.Setenv("AWS_EC2_METADATA_DISABLED", "true")
}

// TestBackendsScheme checks the sqs:// scheme of `outbox relay --broker`:
// the region, endpoint, profile (credentials from a shared credentials
// file), fifo and the outbox's prefix reach the Publisher, and mistakes
// are configuration errors naming the parameter.
func TestBackendsScheme(t *testing.T) {
	awsEnv(t)
	g := testenv.GoAWSServer(t)
	queue := "pre-" + strings.ReplaceAll(testenv.Name(t), ".", "-") + ".fifo"
	createQueue(t, g, queue)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	topic := strings.TrimSuffix(strings.TrimPrefix(queue, "pre-"), ".fifo")
	p, err := backends.OpenPublisher(ctx, "sqs://"+testenv.GoAWSRegion+"?profile=relay&fifo=true&protocol=query&batch_entries=1&prefix=pre.&endpoint="+g.Endpoint(), backends.BrokerOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	m := newMessage(topic, "k", "hi")
	if err := p.Publish(ctx, []*outbox.Message{m})[0]; err != nil {
		t.Fatal(err)
	}
	got := (&reader{g: g, queue: queue}).read(t, 1)[0]
	if got.Attributes[sqs.AttrID] != m.ID || got.GroupID != "k" || got.DeduplicationID != m.ID {
		t.Fatalf("stored %+v; want ID %s in group k", got, m.ID)
	}
	if err := p.Publish(ctx, []*outbox.Message{newMessage("missing", "k", "x")})[0]; !isBlocked(err, "missing") || !strings.Contains(err.Error(), `"pre-missing.fifo"`) {
		t.Errorf("publish to a missing queue: got %v; want an error blocking topic \"missing\" and naming queue pre-missing.fifo", err)
	}

	for _, tc := range []struct {
		url  string
		o    backends.BrokerOptions
		want string
	}{
		{"sqs://?bogus=1", backends.BrokerOptions{}, `unknown query parameter "bogus"`},
		{"sqs://AKID:secret@eu-west-1", backends.BrokerOptions{}, "credentials"},
		{"sqs://?batch_entries=11", backends.BrokerOptions{}, "BatchEntries"},
		{"sqs://?protocol=xml", backends.BrokerOptions{}, "json or query"},
		{"sqs://?queue=orders&fifo=true", backends.BrokerOptions{}, ".fifo"},
		{"sqs://?endpoint=localhost:1", backends.BrokerOptions{}, "Endpoint"},
		{"sqs://eu-west-1", backends.BrokerOptions{TLS: backends.BrokerTLS{Enable: true}}, "--broker-tls"},
	} {
		_, err := backends.OpenPublisher(ctx, tc.url, tc.o)
		if !backends.IsConfigError(err) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("OpenPublisher(%q) = %v; want a configuration error containing %q", tc.url, err, tc.want)
		} else if strings.Contains(err.Error(), "secret") {
			t.Errorf("OpenPublisher(%q): the error shows the secret: %v", tc.url, err)
		}
	}
	// No credentials anywhere: a runtime error saying where they come from.
	t.Setenv("AWS_SHARED_CREDENTIALS_FILE", filepath.Join(t.TempDir(), "none"))
	_, err = backends.OpenPublisher(ctx, "sqs://eu-west-1", backends.BrokerOptions{})
	if err == nil || backends.IsConfigError(err) || !strings.Contains(err.Error(), "credentials") {
		t.Errorf("no credentials: got %v; want an error about the AWS credentials", err)
	}
}

// TestQueueDeletedAndRecreated: a queue deleted by mistake blocks its
// topic; once recreated, publishing works again (the cached URL is
// dropped and resolved anew).
func TestQueueDeletedAndRecreated(t *testing.T) {
	t.Parallel()
	g := testenv.GoAWSServer(t)
	p := dial(t, g, sqs.Options{})
	topic := "del." + testenv.Name(t)
	queue := p.Queue(topic)
	createQueue(t, g, queue)
	ctx := context.Background()
	if err := p.Publish(ctx, []*outbox.Message{newMessage(topic, "k", "1")})[0]; err != nil {
		t.Fatal(err)
	}
	deleteQueue(t, g, queue)
	err := p.Publish(ctx, []*outbox.Message{newMessage(topic, "k", "2")})[0]
	if !isBlocked(err, topic) {
		t.Fatalf("publish to a deleted queue: %v; want an error blocking the topic", err)
	}
	errorContains(t, err, "does not exist", queue)
	createQueue(t, g, queue)
	if err := p.Publish(ctx, []*outbox.Message{newMessage(topic, "k", "3")})[0]; err != nil {
		t.Fatalf("after the queue was recreated: %v", err)
	}
	if got := (&reader{g: g, queue: queue}).read(t, 1)[0]; got.Body != "3" {
		t.Fatalf("the recreated queue holds %q; want 3", got.Body)
	}
}

// TestHeadersPacked: more headers than attributes left, or a header SQS
// cannot carry as an attribute (an empty value, a name with ':'), send
// all the headers as one JSON attribute; a few plain ones go as
// attributes of their own.
func TestHeadersPacked(t *testing.T) {
	t.Parallel()
	g := testenv.GoAWSServer(t)
	p := dial(t, g, sqs.Options{BatchEntries: 1})
	topic := "hdr." + testenv.Name(t)
	createQueue(t, g, p.Queue(topic))
	plain := newMessage(topic, "a", "x")
	plain.Headers = map[string]string{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "Content-Type": "application/json"}
	empty := newMessage(topic, "b", "x")
	empty.Headers = map[string]string{"Empty": "", "Other": "v"}
	many := newMessage(topic, "c", "x")
	many.Headers = map[string]string{}
	for i := range 8 { // with Outbox-Id, -Key and -Created-At: 11 attributes
		many.Headers["H"+string(rune('a'+i))] = "v"
	}
	for i, err := range p.Publish(context.Background(), []*outbox.Message{plain, empty, many}) {
		if err != nil {
			t.Fatalf("message %d: %v", i, err)
		}
	}
	got := make([]testenv.GoAWSMessage, 3)
	for _, m := range (&reader{g: g, queue: p.Queue(topic)}).read(t, 3) {
		for i, sent := range []*outbox.Message{plain, empty, many} {
			if m.Attributes[sqs.AttrID] == sent.ID {
				got[i] = m
			}
		}
	}
	if _, packed := got[0].Attributes[sqs.AttrHeaders]; packed || got[0].Attributes["traceparent"] != plain.Headers["traceparent"] {
		t.Errorf("two plain headers: attributes %v; want each as its own attribute", got[0].Attributes)
	}
	for i := 1; i < 3; i++ {
		if _, packed := got[i].Attributes[sqs.AttrHeaders]; !packed || len(got[i].Attributes) > 5 {
			t.Errorf("message %d: attributes %v; want the headers packed in %s", i, got[i].Attributes, sqs.AttrHeaders)
		}
	}
}

// TestHealth: nil while goaws answers, an error while it is stopped, nil
// again once it is back, and ErrClosed after Close. (Not parallel: it
// stops the shared server.)
func TestHealth(t *testing.T) {
	g := testenv.GoAWSServer(t)
	p := dial(t, g, sqs.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := p.Health(ctx); err != nil {
		t.Fatalf("Health with the server up: %v", err)
	}
	if err := g.Pause(); err != nil {
		t.Fatal(err)
	}
	err := p.Health(ctx)
	if rerr := g.Resume(); rerr != nil {
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
