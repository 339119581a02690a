package testenv

import (
	"math/rand/v2"
	"strings"
	"testing"
)

// nameSuffixLen is the length of the random part of generated names.
const nameSuffixLen = 8

// Name returns a short identifier for t, unique with high probability: a
// sanitized form of t.Name() (lower case, runs of other characters than
// [a-z0-9] replaced by "_", without the leading "Test"), truncated, plus "_"
// and a random suffix. It matches ^[a-z][a-z0-9_]{0,40}$, so it can be used
// unquoted as an SQL schema or table name, a NATS stream name, a queue name,
// and so on. Each call draws a new random suffix.
func Name(t testing.TB) string {
	return randomName(t.Name(), 41)
}

// randomName returns sanitize(testName) truncated so that, with "_" and a
// random suffix of nameSuffixLen characters appended, the result is at most
// maxLen long. The result matches ^[a-z][a-z0-9_]*$.
func randomName(testName string, maxLen int) string {
	const alphabet = "abcdefghijklmnopqrstuvwxyz0123456789"
	suffix := make([]byte, nameSuffixLen)
	for i := range suffix {
		suffix[i] = alphabet[rand.N(len(alphabet))]
	}
	base := sanitize(testName)
	if limit := maxLen - 1 - nameSuffixLen; len(base) > limit {
		base = strings.TrimRight(base[:limit], "_")
	}
	return base + "_" + string(suffix)
}

// sanitize maps a test name to a non-empty string matching
// ^[a-z][a-z0-9_]*$, without trailing "_".
func sanitize(testName string) string {
	for _, p := range []string{"Test", "Benchmark", "Fuzz"} {
		if rest, ok := strings.CutPrefix(testName, p); ok && rest != "" {
			testName = rest
			break
		}
	}
	var b strings.Builder
	underscore := false
	for _, r := range strings.ToLower(testName) {
		if r >= 'a' && r <= 'z' || r >= '0' && r <= '9' {
			b.WriteRune(r)
			underscore = false
		} else if !underscore && b.Len() > 0 {
			b.WriteByte('_')
			underscore = true
		}
	}
	s := strings.TrimRight(b.String(), "_")
	if s == "" || s[0] < 'a' || s[0] > 'z' {
		s = "t" + s
	}
	return s
}
