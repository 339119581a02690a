package cloudevents

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
)

// Headers reads a received message's headers.
type Headers interface {
	// Get returns the value of the header key, "" when it is absent.
	Get(key string) string
	// Keys returns the names of the headers.
	Keys() []string
}

// ErrNotCloudEvent is returned (wrapped) by Decode for a message that
// carries no CloudEvent.
var ErrNotCloudEvent = errors.New("cloudevents: not a CloudEvent")

// IsStructured reports whether a content type is a CloudEvents event
// format's (application/cloudevents…, in any case): the message is in
// structured mode.
func IsStructured(contentType string) bool {
	return len(contentType) >= len(mediaTypePrefix) && strings.EqualFold(contentType[:len(mediaTypePrefix)], mediaTypePrefix)
}

// ContentType returns a received message's content type under binding b:
// contentType (the protocol's property, as in AMQP) when not empty, else
// the value of b's ContentTypeHeader.
func ContentType(b Binding, h Headers, contentType string) string {
	if contentType == "" && b.ContentTypeHeader != "" && h != nil {
		contentType = getFold(h, b.ContentTypeHeader)
	}
	return contentType
}

// Decode reads the CloudEvent of a received message under binding b, in
// either mode: structured when its content type (see [ContentType]) is a
// CloudEvents format's (only the JSON format is read), else binary, from
// b's prefixed headers (matched in any case; for AMQP both the
// "cloudEvents:" and "cloudEvents_" prefixes). It fails, wrapping
// [ErrNotCloudEvent], when a required attribute (id, source, specversion,
// type) is missing, and for a malformed value.
func Decode(b Binding, h Headers, contentType string, body []byte) (*Event, error) {
	contentType = ContentType(b, h, contentType)
	if IsStructured(contentType) {
		return decodeStructured(b, contentType, body)
	}
	ev := &Event{Data: body}
	prefixes := []string{b.Prefix}
	if b.Prefix == AMQP.Prefix {
		prefixes = append(prefixes, "cloudEvents_")
	}
	if h != nil {
		for _, k := range h.Keys() {
			for _, p := range prefixes {
				if len(k) <= len(p) || !strings.EqualFold(k[:len(p)], p) {
					continue
				}
				v := h.Get(k)
				if b.PercentEncode {
					var err error
					if v, err = percentDecode(v); err != nil {
						return nil, fmt.Errorf("%w: %s header %q: %v", ErrNotCloudEvent, b.Name, k, err)
					}
				}
				if err := ev.set(strings.ToLower(k[len(p):]), v); err != nil {
					return nil, fmt.Errorf("%w: %s header %q: %v", ErrNotCloudEvent, b.Name, k, err)
				}
			}
		}
	}
	if b.ContentTypeCarriesData && contentType != "" {
		ev.DataContentType = contentType
	}
	return ev, ev.check(b.Name + " binary mode")
}

// set sets attribute name from its canonical string form.
func (ev *Event) set(name, v string) error {
	switch name {
	case "id":
		ev.ID = v
	case "source":
		ev.Source = v
	case "specversion":
		ev.SpecVersion = v
	case "type":
		ev.Type = v
	case "subject":
		ev.Subject = v
	case "datacontenttype":
		ev.DataContentType = v
	case "time":
		t, err := time.Parse(time.RFC3339Nano, v)
		if err != nil {
			return fmt.Errorf("time %q is not an RFC 3339 timestamp", v)
		}
		ev.Time = t
	default:
		if !validAttrName(name) {
			return fmt.Errorf("%q is not a valid attribute name", name)
		}
		ev.setExtension(name, v)
	}
	return nil
}

// check reports a missing required attribute or another spec version.
func (ev *Event) check(what string) error {
	var missing []string
	for _, n := range []string{"id", "source", "specversion", "type"} {
		if ev.Attribute(n) == "" {
			missing = append(missing, n)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("%w (%s): no %s", ErrNotCloudEvent, what, strings.Join(missing, ", "))
	}
	if ev.SpecVersion != SpecVersion {
		return fmt.Errorf("%w (%s): specversion %q, want %q", ErrNotCloudEvent, what, ev.SpecVersion, SpecVersion)
	}
	return nil
}

// decodeStructured reads the JSON event format.
func decodeStructured(b Binding, contentType string, body []byte) (*Event, error) {
	mt := strings.ToLower(strings.TrimSpace(strings.SplitN(contentType, ";", 2)[0]))
	if mt != "application/cloudevents+json" {
		return nil, fmt.Errorf("%w: %s structured mode in %q, an event format this package does not read (only application/cloudevents+json)", ErrNotCloudEvent, b.Name, mt)
	}
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(body, &obj); err != nil {
		return nil, fmt.Errorf("%w: %s structured mode: the payload is not a JSON object: %v", ErrNotCloudEvent, b.Name, err)
	}
	ev := &Event{}
	for name, raw := range obj {
		switch name {
		case "data":
			continue // after the attributes: its reading depends on datacontenttype
		case "data_base64":
			var s string
			if err := json.Unmarshal(raw, &s); err != nil {
				return nil, fmt.Errorf("%w: data_base64 is not a string", ErrNotCloudEvent)
			}
			d, err := base64.StdEncoding.DecodeString(s)
			if err != nil {
				return nil, fmt.Errorf("%w: data_base64 is not base64: %v", ErrNotCloudEvent, err)
			}
			ev.Data = d
			continue
		}
		v, err := canonical(raw)
		if err != nil {
			return nil, fmt.Errorf("%w: attribute %q: %v", ErrNotCloudEvent, name, err)
		}
		if err := ev.set(name, v); err != nil {
			return nil, fmt.Errorf("%w: %v", ErrNotCloudEvent, err)
		}
	}
	if raw, ok := obj["data"]; ok && !bytes.Equal(raw, []byte("null")) {
		ev.Data = []byte(raw)
		var text string
		if !isJSON(ev.DataContentType) && json.Unmarshal(raw, &text) == nil {
			ev.Data = []byte(text) // text data in a JSON string
		}
	}
	return ev, ev.check(b.Name + " structured mode")
}

// canonical returns the canonical string of a JSON attribute value: a
// string as is, a number or boolean as written.
func canonical(raw json.RawMessage) (string, error) {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s, nil
	}
	var n json.Number
	if json.Unmarshal(raw, &n) == nil {
		return n.String(), nil
	}
	var bl bool
	if json.Unmarshal(raw, &bl) == nil {
		return strconv.FormatBool(bl), nil
	}
	return "", errors.New("not a string, number or boolean")
}

// getFold returns the value of header key matched in any case.
func getFold(h Headers, key string) string {
	if v := h.Get(key); v != "" {
		return v
	}
	for _, k := range h.Keys() {
		if strings.EqualFold(k, key) {
			return h.Get(k)
		}
	}
	return ""
}

// percentDecode undoes the NATS binding's encoding: a double-quoted value
// is unquoted first, then %XY sequences are decoded; the result must be
// valid UTF-8.
func percentDecode(s string) (string, error) {
	if len(s) >= 2 && s[0] == '"' && s[len(s)-1] == '"' {
		var b strings.Builder
		for i := 1; i < len(s)-1; i++ {
			if s[i] == '\\' && i+1 < len(s)-1 {
				i++
			}
			b.WriteByte(s[i])
		}
		s = b.String()
	}
	if !strings.Contains(s, "%") {
		return s, nil
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] != '%' {
			b.WriteByte(s[i])
			continue
		}
		if i+2 >= len(s) {
			return "", fmt.Errorf("truncated percent-encoding in %q", s)
		}
		v, err := strconv.ParseUint(s[i+1:i+3], 16, 8)
		if err != nil {
			return "", fmt.Errorf("bad percent-encoding in %q", s)
		}
		b.WriteByte(byte(v))
		i += 2
	}
	if !utf8.ValidString(b.String()) {
		return "", fmt.Errorf("percent-decoded %q is not valid UTF-8", s)
	}
	return b.String(), nil
}
