package cloudevents_test

import (
	"bytes"
	"context"
	"net/url"
	"strings"
	"testing"

	"github.com/cloudevents/sdk-go/v2/binding"
	"github.com/cloudevents/sdk-go/v2/binding/format"
	"github.com/cloudevents/sdk-go/v2/binding/spec"
	"github.com/cloudevents/sdk-go/v2/event"

	"github.com/outboxrelay/outbox/cloudevents"
)

// The CloudEvents Go SDK (github.com/cloudevents/sdk-go/v2) is the
// consumer of these tests. Its protocol bindings for Kafka, AMQP and NATS
// are separate modules that the module proxy does not serve, so
// sdkMessage gives the SDK a received message the way those bindings do
// (sdk-go's protocol/kafka_sarama and protocol/amqp read headers through
// spec.WithPrefix exactly so): the SDK's own spec tables decide which
// header is which attribute, its event writer checks the values, and its
// event.Validate checks the event. The header rules it is given are the
// bindings' own, quoted:
//
// Kafka Protocol Binding, 3.2.3.1 Property Names: "CloudEvent attributes
// are prefixed with `ce_` for use in the message-headers section."
// 3.2.1 Content Type: "For the _binary_ mode, the header `content-type`
// property MUST be mapped directly to the CloudEvents `datacontenttype`
// attribute."
//
// AMQP Protocol Binding, 3.1.3.1 AMQP Application Property Names:
// "CloudEvent attributes MUST be prefixed with either "cloudEvents_" or
// "cloudEvents:" for use in the application-properties section."
// 3.1.1 AMQP content-type: "For the _binary_ mode, the AMQP `content-type`
// property field value maps directly to the CloudEvents `datacontenttype`
// attribute."
//
// NATS Protocol Binding, 3.1.3.1 NATS Header Names: "all CloudEvents
// context attributes, including extensions, MUST be mapped to NATS headers
// with the same name as the attribute name but prefixed with `ce-`."
// (`datacontenttype` maps to `ce-datacontenttype`.) 3.1.3.2: "string
// values represented as NATS header values MUST be percent-encoded", and
// the receiver performs "a single round of percent-decoding".
//
// Structured mode, all three: the content type is "the media type of an
// event format", "application/cloudevents+json; charset=UTF-8", and the
// payload is the JSON event format.

// sdkMessage is a received message for the SDK: implements
// binding.MessageReader.
type sdkMessage struct {
	specs       *spec.Versions
	prefix      string
	headers     map[string]string
	contentType string // the protocol's content type (header or property)
	ctIsData    bool   // binary mode: content type is datacontenttype (Kafka, AMQP)
	percent     bool   // NATS: values are percent-encoded
	body        []byte
}

func newSDKMessage(b cloudevents.Binding, prefix string, headers map[string]string, contentType string, body []byte) *sdkMessage {
	return &sdkMessage{specs: spec.WithPrefix(prefix), prefix: prefix, headers: headers, contentType: contentType,
		ctIsData: b.ContentTypeCarriesData, percent: b.PercentEncode, body: body}
}

func (m *sdkMessage) ReadEncoding() binding.Encoding {
	if format.Lookup(m.contentType) != nil {
		return binding.EncodingStructured
	}
	if m.headers[m.specs.PrefixedSpecVersionName()] != "" {
		return binding.EncodingBinary
	}
	return binding.EncodingUnknown
}

func (m *sdkMessage) ReadStructured(ctx context.Context, w binding.StructuredWriter) error {
	f := format.Lookup(m.contentType)
	if f == nil {
		return binding.ErrNotStructured
	}
	return w.SetStructuredEvent(ctx, f, bytes.NewReader(m.body))
}

func (m *sdkMessage) ReadBinary(_ context.Context, w binding.BinaryWriter) error {
	version := m.specs.Version(m.headers[m.specs.PrefixedSpecVersionName()])
	if version == nil {
		return binding.ErrNotBinary
	}
	for k, v := range m.headers {
		if m.percent {
			var err error
			if v, err = url.PathUnescape(v); err != nil {
				return err
			}
		}
		if attr := version.Attribute(k); attr != nil {
			if err := w.SetAttribute(attr, v); err != nil {
				return err
			}
		} else if strings.HasPrefix(k, m.prefix) {
			if err := w.SetExtension(strings.ToLower(k[len(m.prefix):]), v); err != nil {
				return err
			}
		}
	}
	if m.ctIsData && m.contentType != "" {
		if err := w.SetAttribute(version.AttributeFromKind(spec.DataContentType), m.contentType); err != nil {
			return err
		}
	}
	return w.SetData(bytes.NewReader(m.body))
}

// GetAttribute implements binding.MessageMetadataReader.
func (m *sdkMessage) GetAttribute(k spec.Kind) (spec.Attribute, interface{}) {
	version := m.specs.Version(m.headers[m.specs.PrefixedSpecVersionName()])
	if version == nil {
		return nil, nil
	}
	attr := version.AttributeFromKind(k)
	if attr == nil {
		return nil, nil
	}
	if k == spec.DataContentType && m.ctIsData {
		return attr, nilIfEmpty(m.contentType)
	}
	return attr, nilIfEmpty(m.value(attr.PrefixedName()))
}

// GetExtension implements binding.MessageMetadataReader.
func (m *sdkMessage) GetExtension(name string) interface{} {
	return nilIfEmpty(m.value(m.prefix + name))
}

func (m *sdkMessage) value(k string) string {
	v := m.headers[k]
	if m.percent {
		if d, err := url.PathUnescape(v); err == nil {
			return d
		}
	}
	return v
}

func nilIfEmpty(s string) interface{} {
	if s == "" {
		return nil
	}
	return s
}

// sdkEvent reads the message with the SDK and validates the event.
func sdkEvent(t *testing.T, m *sdkMessage) *event.Event {
	t.Helper()
	if enc := m.ReadEncoding(); enc == binding.EncodingUnknown {
		t.Fatalf("the SDK sees no CloudEvent: content type %q, headers %v", m.contentType, m.headers)
	}
	ev, err := binding.ToEvent(context.Background(), m)
	if err != nil {
		t.Fatalf("the SDK cannot read the event: %v (headers %v, content type %q, body %s)", err, m.headers, m.contentType, m.body)
	}
	if err := ev.Validate(); err != nil {
		t.Fatalf("the SDK finds the event invalid: %v\n%s", err, ev)
	}
	return ev
}
