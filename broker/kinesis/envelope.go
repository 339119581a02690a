package kinesis

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"time"
	"unicode/utf8"

	"github.com/outboxrelay/outbox"
)

// EnvelopeVersion is the value of the "outbox" field of the envelopes this
// package writes. Decode refuses another.
const EnvelopeVersion = 1

// MaxPartitionKeyChars is the longest partition key Kinesis accepts, in
// Unicode characters.
const MaxPartitionKeyChars = 256

// Envelope is the first line of a record's data: the message's fields, as
// JSON (no raw newline: JSON escapes it in strings). The payload follows
// the newline that ends it, byte for byte.
type Envelope struct {
	// Version is EnvelopeVersion.
	Version int `json:"outbox"`
	// ID is Message.ID: consumers drop a record whose ID they have handled.
	ID string `json:"id"`
	// Topic is Message.Topic (several topics may share a stream).
	Topic string `json:"topic"`
	// Key is Message.Key (absent when empty). The partition key is the key
	// too, unless Kinesis cannot take it as is (see PartitionKey).
	Key string `json:"key,omitempty"`
	// CreatedAt is Message.CreatedAt, RFC 3339 with nanoseconds, UTC
	// (absent when zero).
	CreatedAt string `json:"created_at,omitempty"`
	// Headers are Message.Headers, the trace context among them (absent
	// when none).
	Headers map[string]string `json:"headers,omitempty"`
}

// Encode returns the data of m's record: its Envelope as one line of JSON,
// a newline, and m.Payload. It fails for a message without ID, or with a
// key or header that is not valid UTF-8 (which JSON cannot carry).
func Encode(m *outbox.Message) ([]byte, error) {
	if m.ID == "" {
		return nil, errors.New("message has no ID: messages must be written through a store (or prepared with Message.Prepare)")
	}
	if !utf8.ValidString(m.Key) {
		return nil, fmt.Errorf("message %s: the key is not valid UTF-8, which the envelope (JSON) cannot carry", m.ID)
	}
	for k, v := range m.Headers {
		if !utf8.ValidString(k) || !utf8.ValidString(v) {
			return nil, fmt.Errorf("message %s: header %q is not valid UTF-8, which the envelope (JSON) cannot carry", m.ID, k)
		}
	}
	e := Envelope{Version: EnvelopeVersion, ID: m.ID, Topic: m.Topic, Key: m.Key, Headers: m.Headers}
	if !m.CreatedAt.IsZero() {
		e.CreatedAt = m.CreatedAt.UTC().Format(time.RFC3339Nano)
	}
	var b bytes.Buffer
	b.Grow(256 + len(m.Payload))
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(e); err != nil { // Encode ends the line with '\n'
		return nil, fmt.Errorf("message %s: envelope: %w", m.ID, err)
	}
	b.Write(m.Payload)
	return b.Bytes(), nil
}

// Decode returns the message a record's data carries (written by Encode):
// ID, Topic, Key, Headers, CreatedAt and Payload. The payload is a
// sub-slice of data. Errors say what is wrong with the data.
func Decode(data []byte) (*outbox.Message, error) {
	head, payload, ok := bytes.Cut(data, []byte{'\n'})
	if !ok {
		return nil, errors.New("kinesis: record data is not an outbox envelope: no newline after the JSON line")
	}
	var e Envelope
	dec := json.NewDecoder(bytes.NewReader(head))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&e); err != nil {
		return nil, fmt.Errorf("kinesis: record data is not an outbox envelope: %w", err)
	}
	if e.Version != EnvelopeVersion {
		return nil, fmt.Errorf("kinesis: envelope version %d; this package reads version %d", e.Version, EnvelopeVersion)
	}
	if e.ID == "" {
		return nil, errors.New("kinesis: envelope without id")
	}
	m := &outbox.Message{ID: e.ID, Topic: e.Topic, Key: e.Key, Headers: e.Headers, Payload: payload}
	if e.CreatedAt != "" {
		at, err := time.Parse(time.RFC3339Nano, e.CreatedAt)
		if err != nil {
			return nil, fmt.Errorf("kinesis: envelope of %s: created_at: %w", e.ID, err)
		}
		m.CreatedAt = at
	}
	return m, nil
}

// PartitionKey is the partition key of a message with key and id: the key
// itself when Kinesis takes it (1 to 256 Unicode characters), else
// "outbox-sha256-" and the hex SHA-256 of the key (one key is always one
// partition key, so one shard); a message without key gets its ID (spread
// over the shards: no order, as the outbox promises none for it).
func PartitionKey(key, id string) string {
	if key == "" {
		return id
	}
	if utf8.ValidString(key) && utf8.RuneCountInString(key) <= MaxPartitionKeyChars {
		return key
	}
	sum := sha256.Sum256([]byte(key))
	return "outbox-sha256-" + hex.EncodeToString(sum[:])
}
