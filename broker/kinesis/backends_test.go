package kinesis_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/outboxrelay/outbox"
	"github.com/outboxrelay/outbox/broker/kinesis"
	"github.com/outboxrelay/outbox/cloudevents"
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

// TestBackendsScheme checks the kinesis:// scheme of `outbox relay
// --broker`: the region, endpoint, profile (credentials from a shared
// credentials file) and the outbox's prefix reach the Publisher, stream=
// sends every topic to one stream, and mistakes are configuration errors
// naming the parameter, never showing a secret.
func TestBackendsScheme(t *testing.T) {
	awsEnv(t)
	k := testenv.KinesaliteServer(t)
	name := strings.ReplaceAll(testenv.Name(t), "/", "-")
	stream := "pre." + name
	createStream(t, k, stream, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	p, err := backends.OpenPublisher(ctx, "kinesis://"+testenv.KinesaliteRegion+"?profile=relay&prefix=pre.&max_batch_records=10&endpoint="+k.Endpoint(), backends.BrokerOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	m := newMessage(name, "k", "hi")
	if err := p.Publish(ctx, []*outbox.Message{m})[0]; err != nil {
		t.Fatal(err)
	}
	if got := received(t, newReader(k, stream).read(t, 1)[0]); got.ID != m.ID || got.Key != "k" || got.Topic != name {
		t.Fatalf("stored %+v; want message %s of key k", got, m.ID)
	}
	if err := p.Publish(ctx, []*outbox.Message{newMessage("missing", "k", "x")})[0]; !isBlocked(err, "missing") || !strings.Contains(err.Error(), `"pre.missing"`) {
		t.Errorf("publish to a missing stream: got %v; want an error blocking topic \"missing\" and naming stream pre.missing", err)
	}
	one, err := backends.OpenPublisher(ctx, "kinesis://?region="+testenv.KinesaliteRegion+"&profile=relay&stream="+stream+"&endpoint="+k.Endpoint(), backends.BrokerOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { one.Close() })
	if err := one.Publish(ctx, []*outbox.Message{newMessage("any.topic", "k", "2")})[0]; err != nil {
		t.Fatalf("stream=: %v", err)
	}
	// --cloudevents reaches the publisher: the record is a structured event.
	ce, err := backends.OpenPublisher(ctx, "kinesis://?region="+testenv.KinesaliteRegion+"&profile=relay&stream="+stream+"&endpoint="+k.Endpoint(),
		backends.BrokerOptions{CloudEvents: &cloudevents.Options{Mode: cloudevents.Structured}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ce.Close() })
	if err := ce.Publish(ctx, []*outbox.Message{newMessage("any.topic", "k", `{"n":3}`)})[0]; err != nil {
		t.Fatalf("--cloudevents: %v", err)
	}
	recs := newReader(k, stream).read(t, 3)
	got, err := kinesis.Decode(recs[2].Data)
	if err != nil {
		t.Fatal(err)
	}
	if ev, err := cloudevents.Decode(cloudevents.Kinesis, cloudevents.MapHeaders(got.Headers), "", got.Payload); err != nil || string(ev.Data) != `{"n":3}` || ev.Type != "any.topic" {
		t.Fatalf("--cloudevents structured: event %+v, %v", ev, err)
	}

	for _, tc := range []struct {
		url  string
		o    backends.BrokerOptions
		want string
	}{
		{"kinesis://?bogus=1", backends.BrokerOptions{}, `unknown query parameter "bogus"`},
		{"kinesis://AKID:secret@eu-west-1", backends.BrokerOptions{}, "credentials"},
		{"kinesis://eu-west-1/orders", backends.BrokerOptions{}, "?stream="},
		{"kinesis://eu-west-1?region=us-east-1", backends.BrokerOptions{}, "region"},
		{"kinesis://?max_batch_records=501", backends.BrokerOptions{}, "MaxBatchRecords"},
		{"kinesis://?max_record_bytes=20000000", backends.BrokerOptions{}, "MaxRecordBytes"},
		{"kinesis://?stream=bad/name", backends.BrokerOptions{}, "stream"},
		{"kinesis://?endpoint=localhost:1", backends.BrokerOptions{}, "Endpoint"},
		{"kinesis://?publish_timeout=soon", backends.BrokerOptions{}, "publish_timeout"},
		{"kinesis://eu-west-1", backends.BrokerOptions{TLS: backends.BrokerTLS{Enable: true}}, "--broker-tls"},
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
	_, err = backends.OpenPublisher(ctx, "kinesis://eu-west-1", backends.BrokerOptions{})
	if err == nil || backends.IsConfigError(err) || !strings.Contains(err.Error(), "credentials") {
		t.Errorf("no credentials: got %v; want an error about the AWS credentials", err)
	}
}
