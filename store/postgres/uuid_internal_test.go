package postgres

import (
	"encoding/hex"
	"strings"
	"testing"

	"github.com/outboxrelay/outbox"
)

// parseUUID agrees with outbox.ValidateID on what is a UUID, and decodes
// what formatUUID encodes.
func FuzzParseUUID(f *testing.F) {
	for _, s := range []string{
		outbox.NewID(), "00000000-0000-0000-0000-000000000000", "ffffffff-ffff-ffff-ffff-ffffffffffff",
		"0190F1B4-7c8e-7a3b-9c1d-2e3f4a5b6c7d", "0190f1b4-7c8e-7a3b-9c1d-2e3f4a5b6c7", "0190f1b4x7c8e-7a3b-9c1d-2e3f4a5b6c7d",
		"0190f1b4-7c8e-7a3b-9c1d-2e3f4a5b6c7g", "", "-",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		u, err := parseUUID(s)
		if verr := outbox.ValidateID(s); (err == nil) != (verr == nil) {
			t.Fatalf("parseUUID(%q) error %v, ValidateID error %v: they must agree", s, err, verr)
		}
		if err != nil {
			return
		}
		if got := formatUUID(u); got != s {
			t.Fatalf("formatUUID(parseUUID(%q)) = %q", s, got)
		}
		if want := strings.ReplaceAll(s, "-", ""); hex.EncodeToString(u[:]) != want {
			t.Fatalf("parseUUID(%q) = %x, want %s", s, u, want)
		}
	})
}
