// Package cloudevents maps outbox messages to CloudEvents 1.0 on the wire,
// once for every broker: the publishers (broker/natsjs, broker/rabbitmq,
// broker/kafka, broker/redis, broker/sqs, broker/sns, broker/kinesis) take
// an [*Encoder] through their Options.CloudEvents and
// send each message as a CloudEvent following their protocol binding's
// rules; the consume helpers (inbox/consume) read both content modes back
// with [Decode].
//
// # The event of a message
//
//   - id: the outbox message ID (the same for every copy a retry
//     publishes, so consumers can drop duplicates by source + id);
//   - source: the message's "ce-source" header, else Options.Source
//     (default [SourceDefault]);
//   - specversion: "1.0";
//   - type: the message's "ce-type" header, else Options.TypePrefix plus
//     the topic;
//   - time: CreatedAt, RFC 3339 in UTC;
//   - subject: the message's "ce-subject" header, else its key (none when
//     the key is empty);
//   - datacontenttype: the message's "Content-Type" header (any case),
//     else Options.DataContentType (default [DataContentTypeDefault]);
//   - traceparent and tracestate (the Distributed Tracing extension): the
//     message's W3C trace context headers, which the relay's tracer sets to
//     its producer span (package tracing/otel);
//   - any other "ce-<name>" header whose name is a valid attribute name
//     (lower-case letters and digits, at most 20) becomes the extension
//     attribute <name> (such as "ce-dataschema" for dataschema).
//
// The message's other headers travel as they do without CloudEvents, and
// so do the publishers' own (Nats-Msg-Id, Outbox-Id, …): consumers that
// know the outbox keep working.
//
// # Content modes and bindings
//
// In [Binary] mode the payload is the event's data, unchanged, and each
// attribute travels in a header named by the binding (see [Binding]):
// Kafka "ce_<name>" headers with datacontenttype as the "content-type"
// header; AMQP "cloudEvents:<name>" application properties (headers)
// with datacontenttype as the content-type property; NATS "ce-<name>"
// headers, percent-encoded as the NATS binding requires. In [Structured]
// mode the payload is the event in the JSON event format, content type
// "application/cloudevents+json; charset=UTF-8" (the Kafka "content-type"
// header, the AMQP content-type property, the NATS "Content-Type" header),
// for consumers that cannot read headers.
package cloudevents

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"mime"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/outboxrelay/outbox"
)

// Mode is a CloudEvents content mode.
type Mode string

// The content modes.
const (
	// Binary sends the payload as the event's data and the attributes in
	// headers.
	Binary Mode = "binary"
	// Structured sends the whole event in the JSON event format as the
	// payload.
	Structured Mode = "structured"
)

// ParseMode parses "binary" or "structured".
func ParseMode(s string) (Mode, error) {
	switch m := Mode(strings.ToLower(strings.TrimSpace(s))); m {
	case Binary, Structured:
		return m, nil
	}
	return "", fmt.Errorf("cloudevents: mode must be %q or %q, got %q", Binary, Structured, s)
}

// Defaults and constants.
const (
	// SpecVersion is the CloudEvents version produced.
	SpecVersion = "1.0"
	// SourceDefault is the source of events whose message names none.
	SourceDefault = "/outbox"
	// DataContentTypeDefault is the datacontenttype of messages without a
	// Content-Type header.
	DataContentTypeDefault = "application/json"
	// ContentTypeStructured is the content type of structured-mode events.
	ContentTypeStructured = "application/cloudevents+json; charset=UTF-8"
	// mediaTypePrefix marks structured mode on the receiving side.
	mediaTypePrefix = "application/cloudevents"
	// headerPrefix is the prefix of the message headers that set
	// attributes ("ce-type", "ce-source", …).
	headerPrefix = "ce-"
	// maxAttrNameLen is the CloudEvents limit on attribute names.
	maxAttrNameLen = 20
)

// Options configures an [Encoder].
type Options struct {
	// Mode is Binary (default) or Structured.
	Mode Mode
	// Source is the source of events whose message has no "ce-source"
	// header (default SourceDefault). A URI-reference naming the producer,
	// stable across relay processes (consumers identify an event by source
	// and id): "//orders.example.com/outbox", "urn:example:orders".
	Source string
	// TypePrefix is put before the topic to make the type of events whose
	// message has no "ce-type" header ("com.example." makes topic
	// orders.created type com.example.orders.created). Default none.
	TypePrefix string
	// DataContentType is the datacontenttype of messages without a
	// Content-Type header (default DataContentTypeDefault).
	DataContentType string
}

// WithDefaults returns o with the zero fields set to their defaults.
func (o Options) WithDefaults() Options {
	if o.Mode == "" {
		o.Mode = Binary
	}
	if o.Source == "" {
		o.Source = SourceDefault
	}
	if o.DataContentType == "" {
		o.DataContentType = DataContentTypeDefault
	}
	return o
}

// Validate checks o after WithDefaults, naming the field in its errors.
func (o Options) Validate() error {
	if o.Mode != Binary && o.Mode != Structured {
		return fmt.Errorf("cloudevents: Options.Mode must be %q or %q, got %q", Binary, Structured, o.Mode)
	}
	if u, err := url.Parse(o.Source); err != nil || strings.ContainsAny(o.Source, " \t\r\n") {
		return fmt.Errorf("cloudevents: Options.Source must be a URI-reference such as //orders.example.com/outbox or urn:example:orders, got %q", o.Source)
	} else if u.String() == "" {
		return errors.New("cloudevents: Options.Source is empty")
	}
	if mt, _, err := mime.ParseMediaType(o.DataContentType); err != nil || !strings.Contains(mt, "/") {
		return fmt.Errorf("cloudevents: Options.DataContentType must be a media type such as application/json, got %q", o.DataContentType)
	}
	if !printable(o.TypePrefix) {
		return fmt.Errorf("cloudevents: Options.TypePrefix must be printable ASCII without spaces, got %q", o.TypePrefix)
	}
	return nil
}

// Binding is a protocol binding's way of carrying attributes in a message.
type Binding struct {
	// Name names the binding in errors: "kafka", "amqp", "nats".
	Name string
	// Prefix is put before an attribute's name to make its header name.
	Prefix string
	// ContentTypeCarriesData is true when the protocol's own content type
	// (ContentTypeHeader, or a property) carries datacontenttype in binary
	// mode; false when datacontenttype is a prefixed header like the others.
	ContentTypeCarriesData bool
	// ContentTypeHeader is the header holding the content type ("" when
	// it is a property of the protocol, as in AMQP).
	ContentTypeHeader string
	// PercentEncode percent-encodes the values (space, '"', '%' and
	// anything outside printable ASCII), as the NATS binding requires.
	PercentEncode bool
}

// The bindings of the brokers the outbox publishes to.
var (
	// Kafka: "ce_" headers; datacontenttype is the content-type header.
	Kafka = Binding{Name: "kafka", Prefix: "ce_", ContentTypeCarriesData: true, ContentTypeHeader: "content-type"}
	// AMQP: "cloudEvents:" application properties (AMQP 0-9-1 headers);
	// datacontenttype is the content-type property. The ':' separator is
	// the one every version of the binding accepts (newer versions also
	// allow '_', which Decode reads too).
	AMQP = Binding{Name: "amqp", Prefix: "cloudEvents:", ContentTypeCarriesData: true}
	// NATS: "ce-" headers, percent-encoded, datacontenttype included;
	// structured mode sets the Content-Type header.
	NATS = Binding{Name: "nats", Prefix: "ce-", ContentTypeHeader: "Content-Type", PercentEncode: true}

	// Redis Streams, Amazon SQS and SNS, and Kinesis have no CloudEvents
	// protocol binding of the specification's. The outbox sends their
	// events the way it sends any message's headers on them (Redis entry
	// fields "header.<name>", SQS and SNS message attributes, the Kinesis
	// envelope's "headers"): binary mode as "ce-<name>" headers,
	// datacontenttype included, not percent-encoded (each carrier takes
	// UTF-8 as is); structured mode with a "Content-Type" header.
	Redis   = Binding{Name: "redis", Prefix: "ce-", ContentTypeHeader: "Content-Type"}
	SQS     = Binding{Name: "sqs", Prefix: "ce-", ContentTypeHeader: "Content-Type"}
	SNS     = Binding{Name: "sns", Prefix: "ce-", ContentTypeHeader: "Content-Type"}
	Kinesis = Binding{Name: "kinesis", Prefix: "ce-", ContentTypeHeader: "Content-Type"}
)

// Encoder turns outbox messages into CloudEvents for one binding. It is
// safe for concurrent use.
type Encoder struct {
	opts    Options
	binding Binding
}

// NewEncoder returns an Encoder for opts (after WithDefaults) and b.
func NewEncoder(opts Options, b Binding) (*Encoder, error) {
	opts = opts.WithDefaults()
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	if b.Prefix == "" {
		return nil, errors.New("cloudevents: the Binding has no Prefix")
	}
	return &Encoder{opts: opts, binding: b}, nil
}

// Mode returns the encoder's content mode.
func (e *Encoder) Mode() Mode { return e.opts.Mode }

// Binding returns the encoder's binding.
func (e *Encoder) Binding() Binding { return e.binding }

// Event is a CloudEvent: its attributes in their canonical string form,
// and its data.
type Event struct {
	ID, Source, SpecVersion, Type string
	// Time is the zero time when the event has none.
	Time            time.Time
	Subject         string
	DataContentType string
	// Extensions holds every other attribute (traceparent, tracestate,
	// dataschema, …) by name.
	Extensions map[string]string
	Data       []byte
}

// Attribute returns the attribute name's value in canonical string form,
// "" when the event has none.
func (ev *Event) Attribute(name string) string {
	switch name {
	case "id":
		return ev.ID
	case "source":
		return ev.Source
	case "specversion":
		return ev.SpecVersion
	case "type":
		return ev.Type
	case "time":
		if ev.Time.IsZero() {
			return ""
		}
		return ev.Time.UTC().Format(time.RFC3339Nano)
	case "subject":
		return ev.Subject
	case "datacontenttype":
		return ev.DataContentType
	}
	return ev.Extensions[name]
}

// attributeNames lists the event's attributes (but data) in a fixed order:
// the core ones, then the extensions sorted.
func (ev *Event) attributeNames() []string {
	names := []string{"specversion", "id", "source", "type"}
	if !ev.Time.IsZero() {
		names = append(names, "time")
	}
	if ev.Subject != "" {
		names = append(names, "subject")
	}
	if ev.DataContentType != "" {
		names = append(names, "datacontenttype")
	}
	return append(names, slices.Sorted(maps.Keys(ev.Extensions))...)
}

// Event returns the CloudEvent of m (see the package documentation) and
// the headers of m that are not attributes, to send as they are.
func (e *Encoder) Event(m *outbox.Message) (Event, map[string]string) {
	ev := Event{
		ID:              m.ID,
		Source:          e.opts.Source,
		SpecVersion:     SpecVersion,
		Type:            e.opts.TypePrefix + m.Topic,
		Time:            m.CreatedAt,
		Subject:         m.Key,
		DataContentType: e.opts.DataContentType,
		Data:            m.Payload,
	}
	rest := make(map[string]string, len(m.Headers))
	for k, v := range m.Headers {
		lk := strings.ToLower(k)
		switch {
		case lk == "content-type":
			ev.DataContentType = v
			continue
		case lk == "traceparent" || lk == "tracestate":
			ev.setExtension(lk, v)
			// and sent as a header too: the consumers' tracers read it
		case strings.HasPrefix(lk, headerPrefix) && validAttrName(lk[len(headerPrefix):]):
			switch name := lk[len(headerPrefix):]; name {
			case "source":
				ev.Source = v
			case "type":
				ev.Type = v
			case "subject":
				ev.Subject = v
			case "id", "specversion", "time", "datacontenttype", "data", "data_base64":
				// The outbox's own: a header cannot change them.
			default:
				ev.setExtension(name, v)
			}
			continue
		}
		rest[k] = v
	}
	return ev, rest
}

func (ev *Event) setExtension(name, v string) {
	if ev.Extensions == nil {
		ev.Extensions = map[string]string{}
	}
	ev.Extensions[name] = v
}

// validAttrName reports whether s is a valid CloudEvents attribute name.
func validAttrName(s string) bool {
	if s == "" || len(s) > maxAttrNameLen {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; (c < 'a' || c > 'z') && (c < '0' || c > '9') {
			return false
		}
	}
	return true
}

// Encode returns the message to publish in m's place and the content type
// to set where the protocol has a content-type property (AMQP; "" leaves
// it unset): in binary mode m's payload with the attributes added as the
// binding's headers; in structured mode the JSON event format. The
// returned message shares nothing mutable with m, which is not modified.
// The headers named by the binding's ContentTypeHeader hold the content
// type already.
func (e *Encoder) Encode(m *outbox.Message) (*outbox.Message, string) {
	ev, rest := e.Event(m)
	out := *m
	b := e.binding
	if e.opts.Mode == Structured {
		out.Payload = ev.JSON()
		if b.ContentTypeHeader != "" {
			rest[b.ContentTypeHeader] = ContentTypeStructured
		}
		out.Headers = rest
		return &out, ContentTypeStructured
	}
	contentType := ""
	for _, name := range ev.attributeNames() {
		v := ev.Attribute(name)
		if name == "datacontenttype" && b.ContentTypeCarriesData {
			contentType = v
			if b.ContentTypeHeader != "" {
				rest[b.ContentTypeHeader] = v
			}
			continue
		}
		if b.PercentEncode {
			v = percentEncode(v)
		}
		rest[b.Prefix+name] = v
	}
	out.Headers = rest
	return &out, contentType
}

// JSON returns ev in the JSON event format: data as JSON when
// datacontenttype is JSON and the data is valid JSON, else data_base64.
func (ev *Event) JSON() []byte {
	obj := make(map[string]any, 8+len(ev.Extensions))
	for _, name := range ev.attributeNames() {
		obj[name] = ev.Attribute(name)
	}
	if ev.Data != nil {
		if isJSON(ev.DataContentType) && json.Valid(ev.Data) {
			obj["data"] = json.RawMessage(ev.Data)
		} else {
			obj["data_base64"] = base64.StdEncoding.EncodeToString(ev.Data)
		}
	}
	out, err := json.Marshal(obj)
	if err != nil {
		panic("cloudevents: marshal an event of strings: " + err.Error()) // cannot happen: strings and valid JSON only
	}
	return out
}

// isJSON reports whether a media type is JSON: application/json,
// text/json, or a +json suffix.
func isJSON(contentType string) bool {
	mt, _, err := mime.ParseMediaType(contentType)
	if err != nil {
		return false
	}
	return mt == "application/json" || mt == "text/json" || strings.HasSuffix(mt, "+json")
}

func printable(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] <= ' ' || s[i] > '~' {
			return false
		}
	}
	return true
}

const upperHex = "0123456789ABCDEF"

// percentEncode encodes space, '"', '%' and every byte outside printable
// ASCII as %XY (the NATS binding's rule; UTF-8 bytes one by one).
func percentEncode(s string) string {
	n := 0
	for i := 0; i < len(s); i++ {
		if needsEncoding(s[i]) {
			n++
		}
	}
	if n == 0 {
		return s
	}
	var b strings.Builder
	b.Grow(len(s) + 2*n)
	for i := 0; i < len(s); i++ {
		c := s[i]
		if needsEncoding(c) {
			b.WriteByte('%')
			b.WriteByte(upperHex[c>>4])
			b.WriteByte(upperHex[c&15])
			continue
		}
		b.WriteByte(c)
	}
	return b.String()
}

func needsEncoding(c byte) bool { return c <= ' ' || c == '"' || c == '%' || c > '~' }

// New returns the encoder of a publisher's Options.CloudEvents for its
// binding b: nil, and CloudEvents off, when opts is nil.
func New(opts *Options, b Binding) (*Encoder, error) {
	if opts == nil {
		return nil, nil
	}
	return NewEncoder(*opts, b)
}
