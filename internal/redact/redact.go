// Package redact hides secrets in the text the outbox module prints: URLs
// with a password or a bare token (nats://TOKEN@host), comma-separated URL
// lists (NATS and Kafka clusters), PostgreSQL keyword/value connection
// strings (password=…) and query parameters that carry a secret
// (?password=…, ?sslpassword=…, ?token=…).
//
// It is the one redaction helper of the module: every package that puts a
// URL into an error, a log line or an output table calls [URL], so that the
// rules (and their fuzz test) live in one place.
//
// # Grammars
//
// [URL] does not guess where a secret ends: it reads the string with each
// grammar a driver of the module would read it with, and hides the union of
// what they would take as a secret:
//   - net/url (amqp091-go, franz-go's seed list, the command's --store and
//     --broker checks): the query starts at the first '?', the user info ends
//     at the last '@' before the first '/';
//   - nats.go: a comma-separated list of such URLs, "nats://" put before a
//     part without a scheme, a user name without a password being a token;
//   - pgx (pgconn) for postgres:// and postgresql:// URLs, which follows
//     libpq: the user info ends at the first '@' before any '/', and query
//     keys are percent-decoded (pass%77ord is password);
//   - pgx's keyword/value strings: keys and values separated by any ASCII
//     space (tabs too), values quoted with '…' and escaped with '\'.
//
// A string that a grammar cannot parse is still read as that grammar's
// structure would split it, and a URL that net/url refuses gets the user
// info up to its last '@' hidden too: a password holding '/', '?' or '#'
// that the user did not percent-encode stays hidden although no driver would
// accept it. A fragment (#…) is always hidden: no driver reads it, and it is
// most often the tail of a password holding a '#'.
package redact

import (
	"cmp"
	"net/url"
	"slices"
	"strings"
)

// Mask replaces every hidden part.
const Mask = "xxxxx"

// secretParams are the query parameters and keyword/value keys whose values
// are secrets, in lower case.
var secretParams = []string{
	"password", "pass", "passwd", "pwd",
	"sslpassword", "token", "secret", "auth_token",
	"sasl_password", "access_key", "secret_key", "aws_secret_access_key",
}

// userSchemes are the URL schemes whose user info without a ':' is a user
// name, not a token.
var userSchemes = map[string]bool{"postgres": true, "postgresql": true, "amqp": true, "amqps": true}

// IsSecretParam reports whether a query parameter or connection-string key
// holds a secret, such as password or sslpassword. Case and surrounding
// spaces do not matter.
func IsSecretParam(name string) bool {
	return slices.Contains(secretParams, strings.ToLower(strings.TrimSpace(name)))
}

// URL returns s with its secrets replaced by [Mask]: the password of a URL's
// user info (user:xxxxx@host), the whole user info when it has no ':' (a
// token: nats://xxxxx@host; except for postgres:// and amqp://, where it is
// a user name), the values of secret query parameters and of secret keys of
// a PostgreSQL keyword/value string (host=h password=xxxxx), and a URL's
// fragment. See the package documentation for the grammars it follows. URL
// does not need s to parse.
func URL(s string) string { return WithMask(s, Mask) }

// WithMask is [URL] with another mask; the tests use a mask that cannot
// occur in a URL to tell what was hidden.
func WithMask(s, mask string) string {
	if s == "" {
		return s
	}
	var m spans
	lower := strings.ToLower(s)
	pg := strings.HasPrefix(lower, "postgres://") || strings.HasPrefix(lower, "postgresql://")
	_, hasScheme := urlScheme(s)
	if !pg {
		// pgx reads every string that does not start with postgres:// as
		// keyword/value, whatever it looks like.
		kv := !hasScheme && keywordValueStart(s)
		keywordValue(s, &m, kv)
		if kv {
			// Still a NATS server list if nats.go can read it as one
			// (0=0@host: the token 0=0); only as it reads it, no guess.
			natsList(s, &m, false)
			return m.apply(s, mask)
		}
	}
	if pg {
		postgresURL(s, &m)
		netURL(s, 0, &m, true)
		return m.apply(s, mask)
	}
	netURL(s, 0, &m, !strings.Contains(s, ","))
	natsList(s, &m, true)
	return m.apply(s, mask)
}

// natsList adds the secret spans of s read as nats.go reads a server list:
// split on commas, each part trimmed and read as a URL (nats:// put before
// a part without a scheme). Without guess, a part net/url refuses is
// skipped.
func natsList(s string, m *spans, guess bool) {
	off := 0
	for part := range strings.SplitSeq(s, ",") {
		trimmed := strings.TrimLeft(part, asciiSpace)
		lead := len(part) - len(trimmed)
		trimmed = strings.TrimRight(trimmed, asciiSpace)
		if trimmed != "" {
			if guess || parses(trimmed) {
				netURL(trimmed, off+lead, m, guess)
			}
		}
		off += len(part) + 1
	}
}

// parses reports whether net/url reads s, with nats:// before it when it
// has no scheme, as nats.go does.
func parses(s string) bool {
	if !strings.Contains(s, "://") {
		s = "nats://" + s
	}
	_, err := url.Parse(s)
	return err == nil
}

// Secret returns Mask for a non-empty secret and "" for an empty one, so
// that a printed configuration shows whether a secret is set without showing
// it.
func Secret(s string) string {
	if s == "" {
		return ""
	}
	return Mask
}

// spans are byte ranges of a string to hide.
type spans [][2]int

func (m *spans) add(from, to int) {
	if to > from {
		*m = append(*m, [2]int{from, to})
	}
}

// apply replaces each span of s (merged where they overlap or touch) by
// mask.
func (m spans) apply(s, mask string) string {
	if len(m) == 0 {
		return s
	}
	slices.SortFunc(m, func(a, b [2]int) int { return cmp.Compare(a[0], b[0]) })
	var b strings.Builder
	prev := 0
	for i := 0; i < len(m); {
		from, to := m[i][0], m[i][1]
		for i++; i < len(m) && m[i][0] <= to; i++ {
			to = max(to, m[i][1])
		}
		b.WriteString(s[prev:from])
		b.WriteString(mask)
		prev = to
	}
	b.WriteString(s[prev:])
	return b.String()
}

// urlScheme returns the lower-case scheme of s when s starts with
// scheme://, the scheme being what net/url accepts (a letter, then letters,
// digits, '+', '-', '.').
func urlScheme(s string) (string, bool) {
	i := strings.Index(s, "://")
	if i <= 0 {
		return "", false
	}
	for j, c := range s[:i] {
		letter := 'a' <= c|0x20 && c|0x20 <= 'z'
		if !letter && (j == 0 || !('0' <= c && c <= '9' || c == '+' || c == '-' || c == '.')) {
			return "", false
		}
	}
	return strings.ToLower(s[:i]), true
}

const asciiSpace = " \t\n\r\v\f"

// keywordValueStart reports whether s starts like a keyword/value string:
// a keyword without ':', '/', '@' or '?', then '='.
func keywordValueStart(s string) bool {
	s = strings.TrimLeft(s, asciiSpace)
	eq := strings.IndexByte(s, '=')
	if eq <= 0 {
		return false
	}
	key := strings.TrimRight(s[:eq], asciiSpace)
	return key != "" && !strings.ContainsAny(key, asciiSpace+":/@?&")
}

// netURL adds the secret spans of s (at offset off of the whole string) as
// net/url splits it. A part without a scheme is read as nats.go reads it,
// with nats:// before it. When guess is set and net/url refuses s, the user
// info up to the last '@' is hidden too.
func netURL(s string, off int, m *spans, guess bool) {
	scheme, hasScheme := urlScheme(s)
	start := 0
	parse := s
	switch {
	case hasScheme:
		start = len(scheme) + 3
	case strings.Contains(s, "://"):
		start = strings.Index(s, "://") + 3
	default:
		scheme, parse = "nats", "nats://"+s
	}
	rest := s
	if h := strings.IndexByte(rest, '#'); h >= 0 {
		m.add(off+h+1, off+len(s))
		rest = rest[:h]
	}
	if q := strings.IndexByte(rest, '?'); q >= start {
		query(rest[q+1:], off+q+1, m)
		rest = rest[:q]
	}
	if start <= len(rest) {
		auth := rest[start:]
		if sl := strings.IndexByte(auth, '/'); sl >= 0 {
			auth = auth[:sl]
		}
		if at := strings.LastIndexByte(auth, '@'); at >= 0 {
			userInfo(auth[:at], off+start, scheme, m)
		}
	}
	if !guess || parses(parse) {
		return
	}
	if at := strings.LastIndexByte(s, '@'); at >= start {
		userInfo(s[start:at], off+start, scheme, m)
	}
}

// userInfo adds the secret span of a URL's user info ui at offset off: the
// password after the first ':', or all of it (a token) for a scheme whose
// user info is not a user name.
func userInfo(ui string, off int, scheme string, m *spans) {
	if c := strings.IndexByte(ui, ':'); c >= 0 {
		m.add(off+c+1, off+len(ui))
	} else if !userSchemes[scheme] {
		m.add(off, off+len(ui))
	}
}

// query adds the spans of the values of the secret parameters of a raw
// query string at offset off. Keys are percent-decoded as every driver
// decodes them (pass%77ord is password).
func query(raw string, off int, m *spans) {
	for pair := range strings.SplitSeq(raw, "&") {
		key, _, hasValue := strings.Cut(pair, "=")
		if hasValue && IsSecretParam(percentDecode(key)) {
			m.add(off+len(key)+1, off+len(pair))
		}
		off += len(pair) + 1
	}
}

// percentDecode decodes the valid %XX escapes of s and '+' as a space,
// leaving the rest as it is.
func percentDecode(s string) string {
	if !strings.ContainsAny(s, "%+") {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '%' && i+2 < len(s) {
			hi, ok1 := unhex(s[i+1])
			lo, ok2 := unhex(s[i+2])
			if ok1 && ok2 {
				b.WriteByte(hi<<4 | lo)
				i += 2
				continue
			}
		}
		if s[i] == '+' {
			b.WriteByte(' ')
			continue
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

func unhex(c byte) (byte, bool) {
	switch {
	case '0' <= c && c <= '9':
		return c - '0', true
	case 'a' <= c|0x20 && c|0x20 <= 'f':
		return c | 0x20 - 'a' + 10, true
	}
	return 0, false
}

// postgresURL adds the secret spans of a postgres:// or postgresql:// URL
// as pgx reads it (pgconn's parseURLSettings, which follows libpq): the
// user info ends at the first '@' before any '/', hosts and ports end at
// ':', '/', '?' or ',', the database name at '?', and the query is
// '&'-separated key=value pairs.
func postgresURL(s string, m *spans) {
	i := strings.Index(s, "://") + 3
	if at := strings.IndexAny(s[i:], "@/"); at >= 0 && s[i+at] == '@' {
		if c := strings.IndexByte(s[i:i+at], ':'); c >= 0 {
			m.add(i+c+1, i+at)
		}
		i += at + 1
	}
	for {
		if i < len(s) && s[i] == '[' {
			end := strings.IndexByte(s[i:], ']')
			if end < 0 {
				return // pgx refuses it; nothing more is read
			}
			i += end + 1
		} else if j := strings.IndexAny(s[i:], ":/?,"); j >= 0 {
			i += j
		} else {
			return
		}
		if i < len(s) && s[i] == ':' {
			j := strings.IndexAny(s[i:], "/?,")
			if j < 0 {
				return
			}
			i += j
		}
		if i >= len(s) || s[i] != ',' {
			break
		}
		i++
	}
	if i < len(s) && s[i] == '/' {
		j := strings.IndexByte(s[i:], '?')
		if j < 0 {
			return
		}
		i += j
	}
	if i < len(s) && s[i] == '?' {
		query(s[i+1:], i+1, m)
	}
}

// keywordValue adds the spans of the secret values of a keyword/value
// string as pgx reads it (pgconn's parseKeywordValueSettings): a keyword up
// to '=', then a value quoted with '…' (with \ escapes) or running to the
// next ASCII space (\ escaping the next byte). A quoted secret that never
// ends is hidden to the end. When strict is set (s looks like a
// keyword/value string), the rest of a string pgx cannot read is hidden too.
func keywordValue(s string, m *spans, strict bool) {
	isSpace := func(c byte) bool { return strings.IndexByte(asciiSpace, c) >= 0 }
	skip := func(i int) int {
		for i < len(s) && isSpace(s[i]) {
			i++
		}
		return i
	}
	i := skip(0)
	for i < len(s) {
		eq := strings.IndexByte(s[i:], '=')
		if eq < 0 {
			if strict {
				m.add(i, len(s))
			}
			return
		}
		key := strings.Trim(s[i:i+eq], asciiSpace)
		if strings.ContainsAny(key, asciiSpace) {
			if strict {
				m.add(i, len(s))
			}
			return
		}
		secret := IsSecretParam(key)
		i = skip(i + eq + 1)
		start := i
		switch {
		case i == len(s):
		case s[i] != '\'':
			for ; i < len(s) && !isSpace(s[i]); i++ {
				if s[i] == '\\' {
					i++
					if i == len(s) {
						break
					}
				}
			}
		default:
			for i++; i < len(s) && s[i] != '\''; i++ {
				if s[i] == '\\' {
					i++
				}
			}
			if i >= len(s) {
				if secret || strict {
					m.add(start, len(s))
				}
				return
			}
			i++ // the closing quote
		}
		if secret {
			m.add(start, min(i, len(s)))
		}
		i = skip(i)
	}
}
