package cli_test

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/outboxrelay/outbox"
	"github.com/outboxrelay/outbox/internal/testenv"
)

// TestRelayCloudEvents: `outbox relay --cloudevents structured` publishes
// each message as a JSON CloudEvent with the configured source and type
// prefix; the flags' mistakes are usage errors.
func TestRelayCloudEvents(t *testing.T) {
	t.Parallel()
	dsn := migrated(t, 4)
	ns := testenv.NATS(t)
	st := stream(t, ns, "orders.>")
	msgs := messages("orders.created", 1, 1)
	msgs[0].ID = outbox.NewID()
	write(t, dsn, msgs)
	b := start(t, map[string]string{"OUTBOX_STORE": dsn, "OUTBOX_CLOUDEVENTS_SOURCE": "urn:example:orders"}, "relay", "--broker", ns.ClientURL(),
		"--http-addr", "", "--poll-interval", "50ms", "--cloudevents", "structured", "--cloudevents-type-prefix", "com.example.")
	c, err := st.OrderedConsumer(t.Context(), jetstream.OrderedConsumerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	msg, err := c.Next(jetstream.FetchMaxWait(waitFor))
	if err != nil {
		t.Fatalf("%v; relay log:\n%s", err, b.stderr)
	}
	var ev map[string]any
	if err := json.Unmarshal(msg.Data(), &ev); err != nil {
		t.Fatalf("payload %s: %v", msg.Data(), err)
	}
	if ct := msg.Headers().Get("Content-Type"); !strings.HasPrefix(ct, "application/cloudevents+json") ||
		ev["id"] != msgs[0].ID || ev["source"] != "urn:example:orders" || ev["type"] != "com.example.orders.created" ||
		ev["subject"] != msgs[0].Key || ev["specversion"] != "1.0" {
		t.Fatalf("content type %q, event %v", ct, ev)
	}
	if s, _ := ev["time"].(string); s == "" {
		t.Fatalf("event without time: %v", ev)
	} else if _, err := time.Parse(time.RFC3339Nano, s); err != nil {
		t.Fatalf("time: %v", err)
	}
	if code := b.stop(t); code != 0 {
		t.Fatalf("relay exited %d:\n%s", code, b.stderr)
	}

	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--cloudevents", "json"}, "--cloudevents must be binary or structured"},
		{[]string{"--cloudevents-source", "urn:x"}, "--cloudevents-source is set but --cloudevents is not"},
		{[]string{"--cloudevents", "binary", "--cloudevents-source", "has space"}, "Options.Source must be a URI-reference"},
	} {
		r := run(t, map[string]string{"OUTBOX_STORE": dsn}, append([]string{"relay", "--broker", ns.ClientURL(), "--http-addr", ""}, tc.args...)...)
		if r.code != 2 || !strings.Contains(r.stderr, tc.want) {
			t.Errorf("%v: want exit 2 with %q, got %v", tc.args, tc.want, r)
		}
	}
}
