package kafka_test

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/outboxrelay/outbox/broker/kafka"
)

func TestParseURL(t *testing.T) {
	opts, err := kafka.ParseURL("kafka://127.0.0.1:9092,kafka-2,[::1]:9093/?auto_create=true&delivery_timeout=20s&publish_timeout=5s&max_buffered_records=100&max_message_bytes=2000000&linger=5ms&client_id=relay&key_pipeline=4")
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"127.0.0.1:9092", "kafka-2:9092", "[::1]:9093"}; !slices.Equal(opts.Brokers, want) {
		t.Errorf("Brokers %v; want %v", opts.Brokers, want)
	}
	if !opts.AllowAutoTopicCreation || opts.DeliveryTimeout != 20*time.Second || opts.PublishTimeout != 5*time.Second ||
		opts.MaxBufferedRecords != 100 || opts.MaxMessageBytes != 2000000 || opts.Linger != 5*time.Millisecond || opts.ClientID != "relay" || opts.KeyPipeline != 4 {
		t.Errorf("options %+v", opts)
	}
	if err := opts.Validate(); err != nil {
		t.Errorf("Validate: %v", err)
	}

	for _, tc := range []struct{ url, want string }{
		{"nats://h:1", "want kafka://"},
		{"kafka://", "no broker"},
		{"kafka://a,,b", "empty broker"},
		{"kafka://u:secret@h:1", "credentials"},
		{"kafka://h:1/topic", "path"},
		{"kafka://h:1?bogus=1", `unknown query parameter "bogus"`},
		{"kafka://h:1?auto_create=perhaps", "true or false"},
		{"kafka://h:1?linger=-1s", "duration"},
		{"kafka://h:1?max_buffered_records=0", "positive integer"},
	} {
		_, err := kafka.ParseURL(tc.url)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("ParseURL(%q) = %v; want an error containing %q", tc.url, err, tc.want)
		} else if strings.Contains(err.Error(), "secret") {
			t.Errorf("ParseURL(%q): the error shows the password: %v", tc.url, err)
		}
	}
}

func FuzzParseURL(f *testing.F) {
	for _, s := range []string{
		"kafka://127.0.0.1:9092",
		"kafka://a:1,b:2?auto_create=true&linger=1ms",
		"kafka://[::1]?client_id=x",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		opts, err := kafka.ParseURL(raw)
		if err != nil {
			return
		}
		if len(opts.Brokers) == 0 {
			t.Fatalf("ParseURL(%q) succeeded without brokers", raw)
		}
		_ = opts.Validate() // must not panic
	})
}
