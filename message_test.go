package outbox_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/outboxrelay/outbox"
)

// Vectors computed independently (Python hashlib): first 4 bytes of
// SHA-256(key), little-endian uint32, mod n.
func TestPartitionOfVectors(t *testing.T) {
	cases := []struct {
		key  string
		n    int
		want int
	}{
		{"a", 64, 10},
		{"order-42", 64, 59},
		{"customer-7", 20, 8},
		{"Ωmega", 1000, 519},
		{"hello world", 7, 0},
		{"a", 1, 0},
	}
	for _, c := range cases {
		if got := outbox.PartitionOf(c.key, c.n); got != c.want {
			t.Errorf("PartitionOf(%q, %d) = %d, want %d", c.key, c.n, got, c.want)
		}
	}
}

func TestPartitionOfEmptyKeyIsRandomAndInRange(t *testing.T) {
	seen := map[int]bool{}
	for i := 0; i < 2000; i++ {
		p := outbox.PartitionOf("", 8)
		if p < 0 || p >= 8 {
			t.Fatalf("partition %d out of range", p)
		}
		seen[p] = true
	}
	if len(seen) != 8 {
		t.Fatalf("empty keys reached %d of 8 partitions", len(seen))
	}
}

func TestNewIDIsUUIDv7AndIncreasing(t *testing.T) {
	prev := ""
	for i := 0; i < 10000; i++ {
		id := outbox.NewID()
		if err := outbox.ValidateID(id); err != nil {
			t.Fatal(err)
		}
		if id[14] != '7' {
			t.Fatalf("%s is not version 7", id)
		}
		if v := id[19]; v != '8' && v != '9' && v != 'a' && v != 'b' {
			t.Fatalf("%s has the wrong variant", id)
		}
		if id <= prev {
			t.Fatalf("IDs not increasing: %s after %s", id, prev)
		}
		prev = id
	}
	ms := time.Now().UnixMilli()
	id := outbox.NewID()
	hexMs := strings.ReplaceAll(id[:13], "-", "")
	var got int64
	for _, c := range hexMs {
		got = got*16 + int64(strings.IndexRune("0123456789abcdef", c))
	}
	if got < ms-1000 || got > ms+1000 {
		t.Fatalf("timestamp of %s is %d, now is %d", id, got, ms)
	}
}

func TestValidateNamesTheField(t *testing.T) {
	cases := []struct {
		m     outbox.Message
		field string
		hint  string
	}{
		{outbox.Message{Topic: ""}, "Topic", "is empty"},
		{outbox.Message{Topic: "a..b"}, "Topic", "empty token"},
		{outbox.Message{Topic: "a.b."}, "Topic", "ends with a dot"},
		{outbox.Message{Topic: "orders created"}, "Topic", "use only letters"},
		{outbox.Message{Topic: "orders.>"}, "Topic", "use only letters"},
		{outbox.Message{Topic: strings.Repeat("a", 256)}, "Topic", "limit is 255"},
		{outbox.Message{Topic: "t", Key: strings.Repeat("k", 1025)}, "Key", "limit is 1024"},
		{outbox.Message{Topic: "t", Key: "\xff"}, "Key", "UTF-8"},
		{outbox.Message{Topic: "t", Payload: make([]byte, 1001)}, "Payload", "limit is 1000"},
		{outbox.Message{Topic: "t", Headers: map[string]string{"Nats-Msg-Id": "x"}}, "Headers", "reserved"},
		{outbox.Message{Topic: "t", Headers: map[string]string{"a b": "x"}}, "Headers", "printable ASCII"},
		{outbox.Message{Topic: "t", Headers: map[string]string{"x": "a\r\nb"}}, "Headers", "control character U+000D"},
		{outbox.Message{Topic: "t", ID: "not-a-uuid"}, "ID", "not a UUID"},
	}
	for _, c := range cases {
		err := c.m.Validate(1000)
		var ve *outbox.ValidationError
		if !errors.As(err, &ve) || ve.Field != c.field || !strings.Contains(err.Error(), c.hint) {
			t.Errorf("Validate(%+v) = %v, want a %s error mentioning %q", c.m, err, c.field, c.hint)
		}
	}
	ok := outbox.Message{Topic: "orders.created-v1_x", Key: "k", Payload: make([]byte, 10), Headers: map[string]string{"Content-Type": "application/json"}}
	if err := ok.Validate(1000); err != nil {
		t.Fatal(err)
	}
}

// TestValidateKeyAndHeaderText: keys and header values that a broker would
// alter (NATS trims spaces and tabs and replaces CR and LF) or that hold
// control characters or invalid UTF-8 are refused, naming the field; the
// forms every broker carries byte for byte are accepted.
func TestValidateKeyAndHeaderText(t *testing.T) {
	refused := []struct {
		text, hint string
	}{
		{"a\nb", "control character U+000A"},
		{"a\rb", "control character U+000D"},
		{"a\tb", "control character U+0009"},
		{"\tlead", "control character U+0009"},
		{"a\x00b", "control character U+0000"},
		{"a\x01b", "control character U+0001"},
		{"a\x7fb", "control character U+007F"},
		{"a\u0085b", "control character U+0085"},
		{" lead", "leading or trailing space"},
		{"trail ", "leading or trailing space"},
		{" ", "leading or trailing space"},
		{"\xff\xfe", "not valid UTF-8"},
	}
	for _, c := range refused {
		for _, m := range []outbox.Message{
			{Topic: "t", Key: c.text},
			{Topic: "t", Headers: map[string]string{"X-Value": c.text}},
		} {
			field := "Key"
			if m.Key == "" {
				field = "Headers"
			}
			err := m.Validate(0)
			var ve *outbox.ValidationError
			if !errors.As(err, &ve) || ve.Field != field || !strings.Contains(err.Error(), c.hint) {
				t.Errorf("%s %q: Validate = %v; want a %s error mentioning %q", field, c.text, err, field, c.hint)
			}
		}
	}
	for _, text := range []string{
		"", "a", "with inner  spaces", "ключ ✓", "quote\"and'apostrophe", "a:b;c=d,e", "\u00a0nbsp\u00a0",
		"emoji 🙂", "back\\slash", strings.Repeat("k", outbox.MaxKeyLen),
	} {
		m := outbox.Message{Topic: "t", Key: text, Headers: map[string]string{"X-Value": text}}
		if len(text) > outbox.MaxHeaderValueLen {
			m.Headers = nil
		}
		if err := m.Validate(0); err != nil {
			t.Errorf("%q: %v; want it accepted", text, err)
		}
	}
}

// TestValidateCountsHeaders: payload and headers as published must fit the
// payload limit together, and the headers alone JetStream's fixed limit;
// the errors say the real limit.
func TestValidateCountsHeaders(t *testing.T) {
	m := outbox.Message{ID: outbox.NewID(), Topic: "t", Key: "order-1", CreatedAt: time.Now(), Headers: map[string]string{"Content-Type": "application/json"}}
	hb := m.HeaderBytes()
	// "NATS/1.0\r\n", five "Name: value\r\n" lines and "\r\n".
	want := 10 + len("Content-Type: application/json\r\n") + len("Nats-Msg-Id: \r\n") + 36 + len("Outbox-Id: \r\n") + 36 +
		len("Outbox-Key: order-1\r\n") + len("Outbox-Created-At: \r\n") + len(m.CreatedAt.UTC().Format(time.RFC3339Nano)) + 2
	if hb != want {
		t.Fatalf("HeaderBytes = %d; want %d", hb, want)
	}
	m.Payload = make([]byte, outbox.MaxPayloadDefault-hb)
	if err := m.Validate(0); err != nil {
		t.Fatalf("payload + headers = the limit exactly: %v", err)
	}
	// The case: a payload of exactly 1 MiB passes no more.
	m.Payload = make([]byte, outbox.MaxPayloadDefault)
	err := m.Validate(0)
	var ve *outbox.ValidationError
	if !errors.As(err, &ve) || ve.Field != "Payload" {
		t.Fatalf("payload of MaxPayloadDefault plus headers: %v; want a Payload error", err)
	}
	for _, hint := range []string{"1048576", fmt.Sprint(hb), "counts headers too", fmt.Sprintf("shrink the payload by %d bytes", hb)} {
		if !strings.Contains(err.Error(), hint) {
			t.Errorf("error %q does not say %q", err, hint)
		}
	}
	// 64 headers of 4 KiB: under the per-header limits, over JetStream's
	// fixed 64 KiB header block.
	big := outbox.Message{Topic: "t", Headers: map[string]string{}}
	for i := range outbox.MaxHeaders {
		big.Headers[fmt.Sprintf("X-H%02d", i)] = strings.Repeat("v", outbox.MaxHeaderValueLen)
	}
	err = big.Validate(8 << 20)
	if !errors.As(err, &ve) || ve.Field != "Headers" || !strings.Contains(err.Error(), "at most 65535 bytes") || !strings.Contains(err.Error(), "fixed limit") {
		t.Fatalf("64 headers of 4 KiB: %v; want a Headers error saying JetStream's fixed 65535-byte limit", err)
	}
	// Headers just under the block limit pass.
	fit := outbox.Message{Topic: "t", Headers: map[string]string{"X-Big": ""}}
	fit.Headers["X-Big"] = strings.Repeat("v", min(outbox.MaxHeaderValueLen, outbox.MaxHeaderBytes-fit.HeaderBytes()))
	if err := fit.Validate(0); err != nil {
		t.Fatalf("headers within the limit: %v", err)
	}
}

func TestPrepareFillsIDAndTime(t *testing.T) {
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	m := outbox.Message{Topic: "t"}
	if err := m.Prepare(now, 0); err != nil {
		t.Fatal(err)
	}
	if m.ID == "" || !m.CreatedAt.Equal(now) {
		t.Fatalf("Prepare left %+v", m)
	}
	keep := outbox.Message{ID: outbox.NewID(), Topic: "t", CreatedAt: now.Add(-time.Hour)}
	id := keep.ID
	if err := keep.Prepare(now, 0); err != nil || keep.ID != id || !keep.CreatedAt.Equal(now.Add(-time.Hour)) {
		t.Fatalf("Prepare changed given fields: %+v %v", keep, err)
	}
}

func TestBackoffBounds(t *testing.T) {
	for attempts := 1; attempts < 40; attempts++ {
		for i := 0; i < 50; i++ {
			d := outbox.Backoff(attempts, time.Second, time.Minute)
			full := time.Second << min(attempts-1, 20)
			if full > time.Minute {
				full = time.Minute
			}
			if d < full/2 || d > full {
				t.Fatalf("Backoff(%d) = %v, want within [%v, %v]", attempts, d, full/2, full)
			}
		}
	}
}

func FuzzValidateTopic(f *testing.F) {
	for _, s := range []string{"a", "a.b", "", ".", "a..b", "orders.*", "x-y_z.1"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		err := outbox.ValidateTopic(s)
		if err != nil {
			return
		}
		if s == "" || strings.HasPrefix(s, ".") || strings.HasSuffix(s, ".") || strings.Contains(s, "..") {
			t.Fatalf("accepted %q", s)
		}
		for _, c := range s {
			if !(c == '.' || c == '-' || c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9') {
				t.Fatalf("accepted %q with %q", s, c)
			}
		}
	})
}
