package postgres

import (
	"bytes"
	"maps"
	"strings"
	"testing"
	"time"

	"github.com/outboxrelay/outbox"
)

func TestWALCodecRoundTrip(t *testing.T) {
	binary := make([]byte, 256)
	for i := range binary {
		binary[i] = byte(i)
	}
	msgs := []outbox.Message{
		{ID: outbox.NewID(), Topic: "a.b", Key: "k", Payload: binary, Headers: map[string]string{"x": "1", "traceparent": "00-abc-def-01", "e": ""},
			CreatedAt: time.Date(2024, 5, 6, 7, 8, 9, 123456000, time.UTC)},
		{ID: outbox.NewID(), Topic: "t", CreatedAt: time.Unix(0, 0).UTC()},                                     // no key, payload, headers
		{ID: outbox.NewID(), Topic: "t", Key: "clé 🙂", CreatedAt: time.Date(1960, 1, 1, 0, 0, 0, 0, time.UTC)}, // before the epoch
	}
	for _, m := range msgs {
		b, err := encodeWALMessage(nil, &m)
		if err != nil {
			t.Fatal(err)
		}
		got, err := decodeWALMessage(b)
		if err != nil {
			t.Fatalf("decode: %v", err)
		}
		if got.ID != m.ID || got.Topic != m.Topic || got.Key != m.Key || !bytes.Equal(got.Payload, m.Payload) ||
			!maps.Equal(got.Headers, m.Headers) || !got.CreatedAt.Equal(m.CreatedAt) {
			t.Errorf("round trip:\n got %+v\nwant %+v", got, m)
		}
		if got.Payload == nil {
			t.Errorf("payload decoded as nil, want empty")
		}
		// Equal messages encode equally (headers in name order).
		again, _ := encodeWALMessage(nil, &m)
		if !bytes.Equal(b, again) {
			t.Errorf("two encodings of one message differ")
		}
	}
}

func TestWALCodecErrors(t *testing.T) {
	m := outbox.Message{ID: outbox.NewID(), Topic: "a", Key: "k", Payload: []byte("p"), Headers: map[string]string{"h": "v"}, CreatedAt: time.Now()}
	good, err := encodeWALMessage(nil, &m)
	if err != nil {
		t.Fatal(err)
	}
	cases := map[string][]byte{
		"empty content":      {},
		"encoding version 2": append([]byte{2}, good[1:]...),
		"truncated ID":       good[:10],
		"bytes after":        append(append([]byte{}, good...), 0),
		"truncated Payload":  good[:len(good)-1],
		"out of order": func() []byte {
			b, _ := encodeWALMessage(nil, &outbox.Message{ID: m.ID, Topic: "a", Headers: map[string]string{"a": "1", "b": "2"}})
			i := bytes.Index(b, []byte{1, 'a', 1, '1', 1, 'b'})
			b[i+1], b[i+5] = 'b', 'a'
			return b
		}(),
		"Topic": func() []byte { b, _ := encodeWALMessage(nil, &outbox.Message{ID: m.ID, Topic: "bad topic"}); return b }(),
	}
	for want, b := range cases {
		_, err := decodeWALMessage(b)
		if err == nil || !isWALDecodeError(err) || !strings.Contains(err.Error(), want) {
			t.Errorf("decode of %q: got %v, want an error saying %q", want, err, want)
		}
	}
	// An oversized length is refused before anything is allocated.
	b := append([]byte{walCodecV1}, make([]byte, 16)...)
	b = append(b, 0)                            // CreatedAt 0
	b = append(b, 0xff, 0xff, 0xff, 0xff, 0x0f) // topic length 4 GiB
	if _, err := decodeWALMessage(b); err == nil || !strings.Contains(err.Error(), "over the limit") {
		t.Errorf("huge topic length: got %v", err)
	}
}

// FuzzDecodeWALMessage: whatever the content, decoding never panics, and
// what decodes without error encodes into content that decodes to the same
// message (varints may be written longer than needed; nothing else
// varies).
func FuzzDecodeWALMessage(f *testing.F) {
	for _, m := range []outbox.Message{
		{ID: outbox.NewID(), Topic: "a.b", Key: "k", Payload: []byte("payload"), Headers: map[string]string{"x": "1", "y": "2"}, CreatedAt: time.Now()},
		{ID: outbox.NewID(), Topic: "t", CreatedAt: time.Unix(0, 0)},
	} {
		b, err := encodeWALMessage(nil, &m)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte{})
	f.Add([]byte{1})
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := decodeWALMessage(b)
		if err != nil {
			if !isWALDecodeError(err) {
				t.Fatalf("error of another type: %T %v", err, err)
			}
			return
		}
		again, err := encodeWALMessage(nil, &m)
		if err != nil {
			t.Fatalf("decoded message does not encode: %v", err)
		}
		m2, err := decodeWALMessage(again)
		if err != nil {
			t.Fatalf("re-encoded message does not decode: %v", err)
		}
		if m2.ID != m.ID || m2.Topic != m.Topic || m2.Key != m.Key || !bytes.Equal(m2.Payload, m.Payload) ||
			!maps.Equal(m2.Headers, m.Headers) || !m2.CreatedAt.Equal(m.CreatedAt) {
			t.Fatalf("re-encoding changed the message:\n%+v\n%+v", m, m2)
		}
	})
}
