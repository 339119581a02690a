// Package redact hides secrets in the text the outbox module prints: URLs
// with a password or a bare token (nats://TOKEN@host), comma-separated URL
// lists (NATS and Kafka clusters), PostgreSQL keyword/value connection
// strings (password=…) and query parameters that carry a secret
// (?password=…, ?sslpassword=…, ?token=…).
//
// It is the one redaction helper of the module: every package that puts a
// URL into an error, a log line or an output table calls [URL], so that the
// rules (and their fuzz test) live in one place.
package redact

import (
	"regexp"
	"strings"
)

// keywordValueRe matches the start of a keyword/value connection string.
var keywordValueRe = regexp.MustCompile(`^\s*[A-Za-z_]+\s*=`)

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
// holds a secret, such as password or sslpassword.
func IsSecretParam(name string) bool {
	name = strings.ToLower(name)
	for _, p := range secretParams {
		if name == p {
			return true
		}
	}
	return false
}

// URL returns s with its secrets replaced by [Mask]: for each
// comma-separated part, the password of its user info (user:xxxxx@host), or
// the whole user info when it has no ':' (a token: nats://xxxxx@host; except
// for postgres:// and amqp://, where it is a user name), and the
// values of the secret query parameters. A PostgreSQL keyword/value string
// (host=h password=p) gets its secret values masked too. URL does not need s
// to parse: a password holding '@', '%', ' ' or '/' is still hidden.
func URL(s string) string {
	if s == "" {
		return s
	}
	if keywordValueRe.MatchString(s) {
		return keywordValue(s)
	}
	parts := strings.Split(s, ",")
	for i, p := range parts {
		parts[i] = one(strings.TrimSpace(p))
	}
	return strings.Join(parts, ",")
}

// one redacts a single URL, or a host:port list element.
func one(s string) string {
	start, scheme := 0, ""
	if i := strings.Index(s, "://"); i >= 0 {
		start, scheme = i+3, strings.ToLower(s[:i])
	}
	// The query string starts at the first '?' after the last '@' (a
	// password may hold a '?').
	at := strings.LastIndex(s, "@")
	if at >= start {
		userinfo := s[start:at]
		if user, _, hasPassword := strings.Cut(userinfo, ":"); hasPassword {
			userinfo = user + ":" + Mask
		} else if !userSchemes[scheme] {
			userinfo = Mask // a token, as in nats://TOKEN@host
		}
		s = s[:start] + userinfo + s[at:]
		at = start + len(userinfo)
	} else {
		at = start
	}
	q := strings.IndexByte(s[at:], '?')
	if q < 0 {
		return s
	}
	q += at
	return s[:q+1] + query(s[q+1:])
}

// query masks the secret parameters of a raw query string, keeping its
// order and the fragment.
func query(raw string) string {
	raw, frag, hasFrag := strings.Cut(raw, "#")
	params := strings.Split(raw, "&")
	for i, p := range params {
		name, _, hasValue := strings.Cut(p, "=")
		if hasValue && IsSecretParam(name) {
			params[i] = name + "=" + Mask
		}
	}
	out := strings.Join(params, "&")
	if hasFrag {
		out += "#" + frag
	}
	return out
}

// keywordValue masks the secret values of a PostgreSQL keyword/value
// connection string: host=h password='p w' sslmode=verify-full.
func keywordValue(s string) string {
	var b strings.Builder
	i := 0
	for i < len(s) {
		// Copy spaces.
		for i < len(s) && s[i] == ' ' {
			b.WriteByte(' ')
			i++
		}
		eq := strings.IndexByte(s[i:], '=')
		if eq < 0 {
			b.WriteString(s[i:])
			break
		}
		key := strings.TrimSpace(s[i : i+eq])
		b.WriteString(s[i : i+eq+1])
		i += eq + 1
		for i < len(s) && s[i] == ' ' {
			i++
		}
		// The value: quoted with '…' (\' and \\ escapes) or up to a space.
		start := i
		if i < len(s) && s[i] == '\'' {
			i++
			for i < len(s) && s[i] != '\'' {
				if s[i] == '\\' {
					i++
				}
				i++
			}
			i = min(i+1, len(s))
		} else {
			for i < len(s) && s[i] != ' ' {
				i++
			}
		}
		if IsSecretParam(key) {
			b.WriteString(Mask)
		} else {
			b.WriteString(s[start:i])
		}
	}
	return b.String()
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
