package natsjs

import (
	"strings"
	"testing"
	"time"

	"github.com/outboxrelay/outbox"
)

// TestHeaderBytesIsTheWireSize: outbox.Message.HeaderBytes, which Write
// checks against the limits, is exactly the size of the header block this
// publisher sends.
func TestHeaderBytesIsTheWireSize(t *testing.T) {
	p := &Publisher{opts: Options{SubjectPrefix: "outbox."}.WithDefaults()}
	for _, m := range []*outbox.Message{
		{ID: outbox.NewID(), Topic: "t", CreatedAt: time.Now()},
		{ID: outbox.NewID(), Topic: "t", Key: "ключ ✓", CreatedAt: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC),
			Headers: map[string]string{"Content-Type": "application/json", "Empty": "", "X-Long": strings.Repeat("v", 4096)}},
	} {
		nm := p.natsMsg(p.Subject(m.Topic), m)
		wire := nm.Size() - len(nm.Subject) - len(nm.Reply) - len(nm.Data)
		if got := m.HeaderBytes(); got != wire {
			t.Errorf("HeaderBytes = %d; the publisher sends %d bytes of headers", got, wire)
		}
	}
}
