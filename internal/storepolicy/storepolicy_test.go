package storepolicy

import (
	"strings"
	"testing"
	"unicode/utf8"
)

func TestMaxTablePrefixLen(t *testing.T) {
	if MaxTablePrefixLen != 39 || len(strings.Repeat("p", MaxTablePrefixLen)+LongestSuffix) != MaxIdentifierLen {
		t.Fatalf("MaxTablePrefixLen %d: the longest derived name must be exactly %d bytes", MaxTablePrefixLen, MaxIdentifierLen)
	}
}

func TestCheckIdentifier(t *testing.T) {
	for _, ok := range []string{"a", "_", "outbox", "A_1", strings.Repeat("x", 39)} {
		if err := CheckIdentifier(ok, 39); err != nil {
			t.Errorf("CheckIdentifier(%q): %v", ok, err)
		}
	}
	for name, want := range map[string]string{
		"":                      `"" is not a valid name (empty): use only letters, digits and '_', starting with a letter or '_', 1 to 39 bytes`,
		"1a":                    `"1a" is not a valid name (starts with a digit)`,
		"a-b":                   `"a-b" is not a valid name ('-' at byte 1)`,
		`a"b`:                   `'"' at byte 1`,
		"x; DROP TABLE":         `';' at byte 1`,
		"é":                     `'Ã' at byte 0`,
		strings.Repeat("x", 40): `is 40 bytes; the limit is 39`,
	} {
		if err := CheckIdentifier(name, 39); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("CheckIdentifier(%q) = %v, want an error containing %q", name, err, want)
		}
	}
}

func TestErrorText(t *testing.T) {
	if got := ErrorText("short"); got != "short" {
		t.Errorf("short text changed: %q", got)
	}
	if got := ErrorText("a\x00b\xffc"); got != "ab\uFFFDc" {
		t.Errorf("NUL and invalid UTF-8: %q", got)
	}
	exact := strings.Repeat("x", MaxErrorLen)
	if got := ErrorText(exact); got != exact {
		t.Error("a text of exactly MaxErrorLen bytes was cut")
	}
	long := strings.Repeat("é", MaxErrorLen) // 2 bytes each
	got := ErrorText(long)
	if len(got) > MaxErrorLen || !utf8.ValidString(got) || !strings.HasSuffix(got, "…") || !strings.HasPrefix(long, strings.TrimSuffix(got, "…")) {
		t.Errorf("long text: %d bytes, valid %v, suffix %q", len(got), utf8.ValidString(got), got[len(got)-8:])
	}
	if len(got) < MaxErrorLen-4 {
		t.Errorf("long text cut to %d bytes, want close to %d", len(got), MaxErrorLen)
	}
}
