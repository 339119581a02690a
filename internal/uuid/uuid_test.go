package uuid_test

import (
	"encoding/hex"
	"strings"
	"testing"

	"github.com/outboxrelay/outbox"

	"github.com/outboxrelay/outbox/internal/uuid"
)

// Parse agrees with outbox.ValidateID on what is a UUID, and decodes what
// Format encodes.
func FuzzParse(f *testing.F) {
	for _, s := range []string{
		outbox.NewID(), "00000000-0000-0000-0000-000000000000", "ffffffff-ffff-ffff-ffff-ffffffffffff",
		"0190F1B4-7c8e-7a3b-9c1d-2e3f4a5b6c7d", "0190f1b4-7c8e-7a3b-9c1d-2e3f4a5b6c7", "0190f1b4x7c8e-7a3b-9c1d-2e3f4a5b6c7d",
		"0190f1b4-7c8e-7a3b-9c1d-2e3f4a5b6c7g", "", "-",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		u, ok := uuid.Parse(s)
		if verr := outbox.ValidateID(s); ok != (verr == nil) {
			t.Fatalf("Parse(%q) ok %v, ValidateID error %v: they must agree", s, ok, verr)
		}
		if !ok {
			return
		}
		if got := uuid.Format(u); got != s {
			t.Fatalf("Format(Parse(%q)) = %q", s, got)
		}
		if want := strings.ReplaceAll(s, "-", ""); hex.EncodeToString(u[:]) != want {
			t.Fatalf("Parse(%q) = %x, want %s", s, u, want)
		}
	})
}

// Format writes what outbox.NewID writes: the canonical form.
func TestFormatLikeNewID(t *testing.T) {
	for range 100 {
		id := outbox.NewID()
		u, ok := uuid.Parse(id)
		if !ok || uuid.Format(u) != id {
			t.Fatalf("NewID %q: Parse ok %v, Format %q", id, ok, uuid.Format(u))
		}
	}
}
