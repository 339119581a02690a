package postgres

import (
	"encoding/binary"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/outboxrelay/outbox"

	"github.com/outboxrelay/outbox/internal/uuid"
)

// walCodecV1 is the first version of the binary encoding of a message in a
// logical decoding message (the content of pg_logical_emit_message):
//
//	byte     version (1)
//	[16]byte ID (a UUID)
//	varint   CreatedAt, microseconds since the Unix epoch (zig-zag)
//	uvarint  len(Topic), Topic
//	uvarint  len(Key), Key
//	uvarint  number of headers, then for each: uvarint len(name), name,
//	         uvarint len(value), value (in name order, so that equal
//	         messages encode equally)
//	uvarint  len(Payload), Payload
//
// and nothing after. A reader refuses a version it does not know, so a
// newer writer's messages are dead-lettered with a clear error by an older
// relay, never misread.
const walCodecV1 = 1

// encodeWALMessage appends the encoding of m (prepared: ID set and valid)
// to dst.
func encodeWALMessage(dst []byte, m *outbox.Message) ([]byte, error) {
	id, err := parseUUID(m.ID)
	if err != nil {
		return nil, &outbox.ValidationError{Field: "ID", Reason: err.Error()}
	}
	dst = append(dst, walCodecV1)
	dst = append(dst, id[:]...)
	dst = binary.AppendVarint(dst, m.CreatedAt.UnixMicro())
	dst = appendBytes(dst, m.Topic)
	dst = appendBytes(dst, m.Key)
	dst = binary.AppendUvarint(dst, uint64(len(m.Headers)))
	for _, k := range slices.Sorted(maps.Keys(m.Headers)) {
		dst = appendBytes(dst, k)
		dst = appendBytes(dst, m.Headers[k])
	}
	dst = appendBytes(dst, m.Payload)
	return dst, nil
}

func appendBytes[T string | []byte](dst []byte, b T) []byte {
	dst = binary.AppendUvarint(dst, uint64(len(b)))
	return append(dst, b...)
}

// walDecodeError says why a logical message's content is not a message.
type walDecodeError struct{ reason string }

func (e *walDecodeError) Error() string { return "undecodable outbox message: " + e.reason }

// decodeWALMessage decodes the content of a logical message written by
// encodeWALMessage. The payload and strings are copied: src may be reused.
// It never panics, whatever src holds; a message that decodes but breaks
// the limits of outbox.Message (written by another producer) is returned
// with an error too, so that it can be dead-lettered with what it holds.
func decodeWALMessage(src []byte) (outbox.Message, error) {
	var m outbox.Message
	d := walDecoder{b: src}
	if len(src) == 0 {
		return m, &walDecodeError{"empty content"}
	}
	if v := src[0]; v != walCodecV1 {
		return m, &walDecodeError{fmt.Sprintf("encoding version %d, this relay reads version %d: upgrade the relay", v, walCodecV1)}
	}
	d.b = d.b[1:]
	if len(d.b) < 16 {
		return m, &walDecodeError{"truncated ID"}
	}
	m.ID = uuid.Format([16]byte(d.b[:16]))
	d.b = d.b[16:]
	micros, n := binary.Varint(d.b)
	if n <= 0 {
		return m, &walDecodeError{"bad CreatedAt"}
	}
	d.b = d.b[n:]
	m.CreatedAt = time.UnixMicro(micros).UTC()
	m.Topic = string(d.next("Topic", outbox.MaxTopicLen))
	m.Key = string(d.next("Key", outbox.MaxKeyLen))
	nh := d.uvarint("header count", outbox.MaxHeaders)
	if nh > 0 && d.err == nil {
		m.Headers = make(map[string]string, nh)
		prev := ""
		for i := range nh {
			k := string(d.next("header name", outbox.MaxHeaderNameLen))
			v := string(d.next("header value", outbox.MaxHeaderValueLen))
			if d.err != nil {
				break
			}
			if i > 0 && k <= prev {
				d.err = &walDecodeError{fmt.Sprintf("header %q out of order or repeated", k)}
				break
			}
			prev = k
			m.Headers[k] = v
		}
	}
	if p := d.next("Payload", MaxPayloadLimit); d.err == nil {
		m.Payload = append([]byte{}, p...)
	}
	if d.err != nil {
		return m, d.err
	}
	if len(d.b) != 0 {
		return m, &walDecodeError{fmt.Sprintf("%d bytes after the payload", len(d.b))}
	}
	if err := m.Validate(MaxPayloadLimit); err != nil {
		return m, &walDecodeError{err.Error()}
	}
	return m, nil
}

// walDecoder reads length-prefixed fields; the first error sticks.
type walDecoder struct {
	b   []byte
	err error
}

func (d *walDecoder) uvarint(what string, limit int) int {
	if d.err != nil {
		return 0
	}
	v, n := binary.Uvarint(d.b)
	if n <= 0 {
		d.err = &walDecodeError{"bad " + what}
		return 0
	}
	if v > uint64(limit) {
		d.err = &walDecodeError{fmt.Sprintf("%s %d is over the limit %d", what, v, limit)}
		return 0
	}
	d.b = d.b[n:]
	return int(v)
}

func (d *walDecoder) next(what string, limit int) []byte {
	n := d.uvarint("length of "+what, limit)
	if d.err != nil {
		return nil
	}
	if n > len(d.b) {
		d.err = &walDecodeError{fmt.Sprintf("truncated %s (%d bytes announced, %d left)", what, n, len(d.b))}
		return nil
	}
	v := d.b[:n]
	d.b = d.b[n:]
	return v
}

// isWALDecodeError reports whether err is a content decoding error.
func isWALDecodeError(err error) bool {
	var de *walDecodeError
	return errors.As(err, &de)
}
