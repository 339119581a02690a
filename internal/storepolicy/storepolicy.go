// Package storepolicy is the policy the outbox and inbox stores share, kept
// in one place so that a name or an error text one store accepts, another
// accepts the same way: which schema names and table prefixes are valid and
// how long they may be, and how a failure's error text is made storable.
package storepolicy

import (
	"fmt"
	"strings"
	"unicode/utf8"
)

const (
	// MaxIdentifierLen is PostgreSQL's identifier limit (NAMEDATALEN-1
	// bytes): a longer name is truncated, silently, and two long names can
	// become one. It bounds a schema name.
	MaxIdentifierLen = 63
	// LongestSuffix is the longest suffix the SQL outbox stores (PostgreSQL
	// and SQLite) append to TablePrefix: the index of the dead letters by
	// failure time, "<prefix>_dead_letters_failed_idx".
	LongestSuffix = "_dead_letters_failed_idx"
	// MaxTablePrefixLen bounds an outbox TablePrefix so that every name
	// derived from it fits MaxIdentifierLen: 63 - 24 = 39 bytes. The SQLite
	// store, which has no such limit, uses the same bound, so that one
	// prefix works with both.
	MaxTablePrefixLen = MaxIdentifierLen - len(LongestSuffix)

	// MaxErrorLen bounds the error text stored for a failure, in bytes.
	MaxErrorLen = 4096

	// DeadLetterLimitDefault is how many dead letters a store's DeadLetters
	// lists when the filter's Limit is 0.
	DeadLetterLimitDefault = 100
)

// CheckIdentifier returns an error saying what is wrong with name as a
// schema name or table prefix of at most maxLen bytes, or nil. A valid name
// is 1 to maxLen letters, digits and '_', starting with a letter or '_': names
// are quoted in SQL anyway, and the rule keeps them portable, readable and
// free of anything that could smuggle SQL.
func CheckIdentifier(name string, maxLen int) error {
	if len(name) > maxLen {
		return fmt.Errorf("%q is %d bytes; the limit is %d", name, len(name), maxLen)
	}
	invalid := func(what string) error {
		return fmt.Errorf("%q is not a valid name (%s): use only letters, digits and '_', starting with a letter or '_', 1 to %d bytes", name, what, maxLen)
	}
	if name == "" {
		return invalid("empty")
	}
	for i := 0; i < len(name); i++ {
		switch c := name[i]; {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c == '_':
		case c >= '0' && c <= '9':
			if i == 0 {
				return invalid("starts with a digit")
			}
		default:
			return invalid(fmt.Sprintf("%q at byte %d", c, i))
		}
	}
	return nil
}

// ErrorText makes a failure's error text storable by every store: valid
// UTF-8 (an invalid byte becomes U+FFFD), without NUL bytes (PostgreSQL
// text cannot hold them), and at most MaxErrorLen bytes: a longer text is
// cut at a character boundary and ends with "…".
func ErrorText(s string) string {
	s = strings.ToValidUTF8(s, "\uFFFD")
	s = strings.ReplaceAll(s, "\x00", "")
	if len(s) <= MaxErrorLen {
		return s
	}
	cut := MaxErrorLen - len("…")
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "…"
}
