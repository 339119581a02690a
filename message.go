package outbox

import (
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/outboxrelay/outbox/internal/uuid"
)

// Limits on a message, checked by [Message.Validate] at write time.
const (
	// MaxTopicLen is the longest topic accepted, in bytes.
	MaxTopicLen = 255
	// MaxKeyLen is the longest key accepted, in bytes.
	MaxKeyLen = 1024
	// MaxPayloadDefault is the default payload limit: 1 MiB, the default
	// maximum message size of NATS and well under RabbitMQ's and Kafka's.
	MaxPayloadDefault = 1 << 20
	// MaxHeaders is the most headers a message may carry.
	MaxHeaders = 64
	// MaxHeaderNameLen and MaxHeaderValueLen bound each header.
	MaxHeaderNameLen  = 128
	MaxHeaderValueLen = 4096
	// MaxHeaderBytes bounds a message's headers as published
	// ([Message.HeaderBytes]): JetStream refuses a header block over 65535
	// bytes, a fixed limit of the server that no setting raises.
	MaxHeaderBytes = 65535
)

// Message is one message to publish. Applications build it and hand it to a
// store's Write function inside their own transaction.
//
// ID and CreatedAt are filled in by Write when empty. A Message is not
// retained by Write after it returns.
type Message struct {
	// ID is a UUIDv7 string; every published copy carries it (NATS
	// Nats-Msg-Id, AMQP message-id, a Kafka header) so that brokers and
	// consumers can drop duplicates. Empty: Write assigns [NewID].
	ID string
	// Topic names the destination: a NATS subject, an AMQP routing key, a
	// Kafka topic. Tokens of [A-Za-z0-9_-] separated by single dots.
	Topic string
	// Key orders messages: messages with the same non-empty key are first
	// published in commit order. Empty: no order. Valid UTF-8 without
	// control characters and without leading or trailing spaces (see
	// [Message.Validate]), so that it reaches every broker byte for byte.
	Key string
	// Payload is the message body. Payload and headers together (as
	// [Message.HeaderBytes] counts them) must fit in the store's payload
	// limit (default [MaxPayloadDefault]), as they must fit in NATS's
	// max_payload.
	Payload []byte
	// Headers travel with the message. Names are printable ASCII without
	// spaces or ':' and must not start with "Outbox-" or "Nats-"
	// (reserved); values follow the rules of Key.
	Headers map[string]string
	// CreatedAt is when the message was written. Zero: Write sets it.
	CreatedAt time.Time
}

// ValidationError reports an invalid message field.
type ValidationError struct {
	Field  string // "Topic", "Key", "Payload", "Headers", "ID"
	Reason string
}

func (e *ValidationError) Error() string {
	return "outbox: invalid message " + e.Field + ": " + e.Reason
}

// Validate checks the message against the limits, with maxPayload bytes as
// the limit of payload and headers together (0 means [MaxPayloadDefault]).
// Errors are *[ValidationError] naming the field and what to change.
//
// The key and the header values must be valid UTF-8 without control
// characters (U+0000 to U+001F, U+007F to U+009F) and without leading or
// trailing spaces: NATS would trim the spaces and replace CR and LF, and
// other brokers' consumers often choke on control characters, so such a
// message is refused here rather than altered later. The headers, with the
// ones the publishers add ([Message.HeaderBytes]), must fit in
// [MaxHeaderBytes], and the payload plus the headers in maxPayload: NATS
// counts headers against its max_payload.
func (m *Message) Validate(maxPayload int) error {
	if maxPayload <= 0 {
		maxPayload = MaxPayloadDefault
	}
	if m.ID != "" {
		if err := ValidateID(m.ID); err != nil {
			return &ValidationError{"ID", err.Error()}
		}
	}
	if err := ValidateTopic(m.Topic); err != nil {
		return &ValidationError{"Topic", err.Error()}
	}
	if len(m.Key) > MaxKeyLen {
		return &ValidationError{"Key", fmt.Sprintf("is %d bytes; the limit is %d", len(m.Key), MaxKeyLen)}
	}
	if err := validateText(m.Key); err != nil {
		return &ValidationError{"Key", fmt.Sprintf("%q %v", m.Key, err)}
	}
	if len(m.Payload) > maxPayload {
		return &ValidationError{"Payload", fmt.Sprintf("is %d bytes; the limit is %d: shrink the payload or raise the store's MaxPayload", len(m.Payload), maxPayload)}
	}
	if len(m.Headers) > MaxHeaders {
		return &ValidationError{"Headers", fmt.Sprintf("has %d entries; the limit is %d", len(m.Headers), MaxHeaders)}
	}
	for k, v := range m.Headers {
		if k == "" || len(k) > MaxHeaderNameLen {
			return &ValidationError{"Headers", fmt.Sprintf("name %q must be 1 to %d bytes", k, MaxHeaderNameLen)}
		}
		for i := 0; i < len(k); i++ {
			c := k[i]
			if c <= ' ' || c >= 0x7f || c == ':' {
				return &ValidationError{"Headers", fmt.Sprintf("name %q may hold only printable ASCII without spaces or ':'", k)}
			}
		}
		lk := strings.ToLower(k)
		if strings.HasPrefix(lk, "outbox-") || strings.HasPrefix(lk, "nats-") {
			return &ValidationError{"Headers", fmt.Sprintf("name %q uses a reserved prefix (Outbox-, Nats-)", k)}
		}
		if len(v) > MaxHeaderValueLen {
			return &ValidationError{"Headers", fmt.Sprintf("value of %q is %d bytes; the limit is %d", k, len(v), MaxHeaderValueLen)}
		}
		if err := validateText(v); err != nil {
			return &ValidationError{"Headers", fmt.Sprintf("value of %q: %q %v", k, v, err)}
		}
	}
	hb := m.HeaderBytes()
	if hb > MaxHeaderBytes {
		return &ValidationError{"Headers", fmt.Sprintf("take %d bytes as published (with the key and the Outbox- and Nats-Msg-Id headers the publishers add); JetStream accepts at most %d bytes of headers, a fixed limit of the server: send fewer or shorter headers",
			hb, MaxHeaderBytes)}
	}
	if total := len(m.Payload) + hb; total > maxPayload {
		return &ValidationError{"Payload", fmt.Sprintf("is %d bytes and the headers take %d bytes as published (with the key and the Outbox- and Nats-Msg-Id headers the publishers add): %d bytes together, over the limit of %d, which counts headers too as NATS's max_payload does: shrink the payload by %d bytes, or raise the store's MaxPayload (and the broker's limit)",
			len(m.Payload), hb, total, maxPayload, total-maxPayload)}
	}
	return nil
}

// validateText checks a key or header value: valid UTF-8, no control
// characters, no leading or trailing space. Its error completes a sentence
// that starts with the quoted value.
func validateText(s string) error {
	if !utf8.ValidString(s) {
		return errors.New("is not valid UTF-8")
	}
	for i, r := range s {
		if unicode.IsControl(r) {
			return fmt.Errorf("has the control character %U at byte %d: remove it (encode binary data, such as with base64)", r, i)
		}
	}
	if strings.HasPrefix(s, " ") || strings.HasSuffix(s, " ") {
		return errors.New("has a leading or trailing space, which NATS would trim: remove it")
	}
	return nil
}

// Sizes of the NATS header block, as nats.go encodes it: a version line,
// one "Name: value\r\n" line per header, and an empty line.
const (
	headerBlockOverhead = len("NATS/1.0\r\n") + len("\r\n")
	headerLineOverhead  = len(": \r\n")
	// maxCreatedAtLen is the length of a UTC time of years 0 to 9999 in
	// RFC 3339 with nanoseconds.
	maxCreatedAtLen = len("2006-01-02T15:04:05.999999999Z")
)

// HeaderBytes returns the size of m's headers as published: the NATS
// header block of m.Headers plus the headers the publishers add
// (Nats-Msg-Id, Outbox-Id, Outbox-Key when Key is set, Outbox-Created-At).
// It is what JetStream's header limit ([MaxHeaderBytes]) and NATS's
// max_payload count; the other brokers' encodings are about as large. An
// empty ID or zero CreatedAt count as the ones Write fills in.
func (m *Message) HeaderBytes() int {
	n := headerBlockOverhead
	for k, v := range m.Headers {
		n += len(k) + headerLineOverhead + len(v)
	}
	const idLen = 36
	n += len("Nats-Msg-Id") + headerLineOverhead + idLen
	n += len(HeaderID) + headerLineOverhead + idLen
	if m.Key != "" {
		n += len(HeaderKey) + headerLineOverhead + len(m.Key)
	}
	created := maxCreatedAtLen
	if !m.CreatedAt.IsZero() {
		created = len(m.CreatedAt.UTC().Format(time.RFC3339Nano))
	}
	n += len(HeaderCreatedAt) + headerLineOverhead + created
	return n
}

// ValidateTopic reports whether topic is usable on every broker: 1 to
// [MaxTopicLen] bytes, tokens of [A-Za-z0-9_-] separated by single dots.
func ValidateTopic(topic string) error {
	if topic == "" {
		return fmt.Errorf("is empty; set a topic such as %q", "orders.created")
	}
	if len(topic) > MaxTopicLen {
		return fmt.Errorf("is %d bytes; the limit is %d", len(topic), MaxTopicLen)
	}
	prevDot := true
	for i := 0; i < len(topic); i++ {
		c := topic[i]
		switch {
		case c == '.':
			if prevDot {
				return fmt.Errorf("%q has an empty token: dots must separate non-empty tokens", topic)
			}
			prevDot = true
			continue
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', c == '_', c == '-':
		default:
			return fmt.Errorf("%q has %q at byte %d: use only letters, digits, '_', '-' and '.'", topic, c, i)
		}
		prevDot = false
	}
	if prevDot {
		return fmt.Errorf("%q ends with a dot", topic)
	}
	return nil
}

// ValidateID reports whether id is a canonical lower-case UUID string.
func ValidateID(id string) error {
	if len(id) != 36 {
		return fmt.Errorf("%q is not a UUID (want 36 characters like 0190f1b4-7c8e-7a3b-9c1d-2e3f4a5b6c7d)", id)
	}
	for i := 0; i < 36; i++ {
		c := id[i]
		if i == 8 || i == 13 || i == 18 || i == 23 {
			if c != '-' {
				return fmt.Errorf("%q is not a UUID: want '-' at position %d", id, i)
			}
			continue
		}
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return fmt.Errorf("%q is not a lower-case UUID: bad character at position %d", id, i)
		}
	}
	return nil
}

var idGen struct {
	sync.Mutex
	lastMs  int64
	counter uint16 // 12-bit rand_a counter for monotonicity within a millisecond
}

// NewID returns a new UUIDv7 (RFC 9562): 48-bit Unix milliseconds, then a
// 12-bit counter that keeps IDs from one process increasing within a
// millisecond, then 62 random bits. Safe for concurrent use.
func NewID() string {
	var b [16]byte
	if _, err := rand.Read(b[6:]); err != nil {
		panic("outbox: crypto/rand failed: " + err.Error())
	}
	ms := time.Now().UnixMilli()
	idGen.Lock()
	if ms <= idGen.lastMs {
		ms = idGen.lastMs
		idGen.counter++
		if idGen.counter > 0x0fff {
			ms++
			idGen.counter = 0
		}
	} else {
		idGen.counter = uint16(b[6]&0x07)<<8 | uint16(b[7]) // random start, room to count
	}
	idGen.lastMs = ms
	ctr := idGen.counter
	idGen.Unlock()

	var t [8]byte
	binary.BigEndian.PutUint64(t[:], uint64(ms))
	copy(b[0:6], t[2:8])
	b[6] = 0x70 | byte(ctr>>8)&0x0f
	b[7] = byte(ctr)
	b[8] = b[8]&0x3f | 0x80
	return uuid.Format(b)
}

// Prepare fills in an empty ID and CreatedAt (with now) and validates the
// message. Store Write functions call it for every message.
func (m *Message) Prepare(now time.Time, maxPayload int) error {
	if m.ID == "" {
		m.ID = NewID()
	}
	if m.CreatedAt.IsZero() {
		m.CreatedAt = now
	}
	return m.Validate(maxPayload)
}
