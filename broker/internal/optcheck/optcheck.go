// Package optcheck is what the publishers under broker/ share when they
// check their Options and read them from a URL: the bounds of a number or a
// duration, the characters of a name, and the walk over a URL's query
// parameters. Each publisher's Validate and ParseURL state only their own
// fields; the error texts are the same for every publisher.
package optcheck

import (
	"fmt"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Fields checks Options field by field and keeps the first failure, so
// that the checks read as a list. Its errors start with the publisher's
// name: "kafka: MaxBufferedRecords must be between 1 and 1000000, got 0".
type Fields struct {
	name string
	err  error
}

// Check starts the checks of the publisher called name ("kafka").
func Check(name string) *Fields { return &Fields{name: name} }

// Between checks lo <= v <= hi.
func (f *Fields) Between(field string, v, lo, hi int) {
	f.Failf(v < lo || v > hi, "%s must be between %d and %d, got %d", field, lo, hi, v)
}

// AtLeast checks v >= lo.
func (f *Fields) AtLeast(field string, v, lo time.Duration) {
	f.Failf(v < lo, "%s must be at least %v, got %v", field, lo, v)
}

// Failf records the failure format describes (wrapping a %w argument) when
// bad, unless an earlier check failed.
func (f *Fields) Failf(bad bool, format string, args ...any) {
	if bad && f.err == nil {
		f.err = fmt.Errorf("%s: "+format, append([]any{f.name}, args...)...)
	}
}

// Err returns the first failure, or nil.
func (f *Fields) Err() error { return f.err }

// Name checks a broker's name of a destination: 1 to maxLen bytes of
// letters, digits and the bytes of extra, which the error lists in their
// order.
func Name(name string, maxLen int, extra string) error {
	if name == "" || len(name) > maxLen {
		return fmt.Errorf("must be 1 to %d bytes, got %d", maxLen, len(name))
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', strings.IndexByte(extra, c) >= 0:
		default:
			return fmt.Errorf("%q has %q at byte %d: use only letters, digits, %s", name, c, i, quoteBytes(extra))
		}
	}
	return nil
}

// quoteBytes lists the bytes of s: "'.', '_' and '-'".
func quoteBytes(s string) string {
	q := make([]string, len(s))
	for i := range len(s) {
		q[i] = "'" + s[i:i+1] + "'"
	}
	if len(q) < 2 {
		return strings.Join(q, "")
	}
	return strings.Join(q[:len(q)-1], ", ") + " and " + q[len(q)-1]
}

// Query reads the query parameters q of a publisher's URL: each must be
// one of accepted, or of passed (left to the driver: read is not called
// for them), and given once; read sets the field of each accepted one.
// Errors start with subject, such as `kafka: URL "kafka://h:9092?x=1"`
// (never with a password), and name the parameter.
func Query(q url.Values, subject string, accepted, passed []string, read func(Param) error) error {
	for name, vals := range q {
		if slices.Contains(passed, name) {
			continue
		}
		if !slices.Contains(accepted, name) {
			return fmt.Errorf("%s: unknown query parameter %q; accepted: %s", subject, name, strings.Join(slices.Concat(accepted, passed), ", "))
		}
		if len(vals) != 1 {
			return fmt.Errorf("%s: query parameter %q is given %d times; give it once", subject, name, len(vals))
		}
		if err := read(Param{Name: name, Value: vals[0], subject: subject}); err != nil {
			return err
		}
	}
	return nil
}

// Param is one query parameter given to Query's read.
type Param struct {
	Name, Value string
	subject     string
}

// Bad is the error of a value that is not what the parameter wants
// ("a positive integer").
func (p Param) Bad(want string) error {
	return fmt.Errorf("%s: query parameter %s=%q must be %s", p.subject, p.Name, p.Value, want)
}

// Bool reads true or false.
func (p Param) Bool() (bool, error) {
	b, err := strconv.ParseBool(p.Value)
	if err != nil {
		return false, p.Bad("true or false")
	}
	return b, nil
}

// PositiveInt reads an integer of at least 1.
func (p Param) PositiveInt() (int, error) {
	n, err := strconv.Atoi(p.Value)
	if err != nil || n < 1 {
		return 0, p.Bad("a positive integer")
	}
	return n, nil
}

// Duration reads a duration of at least 0.
func (p Param) Duration() (time.Duration, error) {
	d, err := time.ParseDuration(p.Value)
	if err != nil || d < 0 {
		return 0, p.Bad("a duration such as 10s")
	}
	return d, nil
}

// PositiveDuration reads a duration above 0.
func (p Param) PositiveDuration() (time.Duration, error) {
	d, err := time.ParseDuration(p.Value)
	if err != nil || d <= 0 {
		return 0, p.Bad("a positive duration such as 10s")
	}
	return d, nil
}
