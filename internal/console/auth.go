package console

import (
	"bufio"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"time"

	"golang.org/x/crypto/bcrypt"
)

// Limits of the credentials files.
const (
	// TokenMinLength is the shortest bearer token accepted.
	TokenMinLength = 16
	// SessionTTL is how long a browser stays signed in with the token.
	SessionTTL = 12 * time.Hour
	// sessionsMax bounds the sessions kept in memory.
	sessionsMax = 10000
)

const sessionCookie = "outbox_console_session"

// Auth authenticates console users: HTTP basic auth against a password
// file, and a bearer token (sent in an Authorization header, or typed once
// into the sign-in page, which sets a session cookie). A nil *Auth means
// no authentication, which the console allows for loopback clients only.
type Auth struct {
	users map[string]string // user → password, plain or a bcrypt hash
	token string

	mu       sync.Mutex
	verified map[[32]byte]bool  // bcrypt checks that passed, by hash of user:password
	sessions map[string]session // by session ID
}

type session struct{ expires time.Time }

// LoadAuth reads the password file (lines user:password, where password
// may be a bcrypt hash as `htpasswd -B` writes; # starts a comment) and the
// token file (one line). Either may be empty; both empty return nil. Errors
// name the file and the line, never a secret.
func LoadAuth(basicFile, tokenFile string) (*Auth, error) {
	if basicFile == "" && tokenFile == "" {
		return nil, nil
	}
	a := &Auth{users: map[string]string{}, verified: map[[32]byte]bool{}, sessions: map[string]session{}}
	if basicFile != "" {
		f, err := os.Open(basicFile)
		if err != nil {
			return nil, fmt.Errorf("password file: %w", err)
		}
		defer f.Close()
		if a.users, err = ParsePasswords(f); err != nil {
			return nil, fmt.Errorf("password file %s: %w", basicFile, err)
		}
	}
	if tokenFile != "" {
		b, err := os.ReadFile(tokenFile)
		if err != nil {
			return nil, fmt.Errorf("token file: %w", err)
		}
		a.token = strings.TrimSpace(string(b))
		if strings.ContainsAny(a.token, " \t\r\n") {
			return nil, fmt.Errorf("token file %s: the token must be one line without spaces", tokenFile)
		}
		if len(a.token) < TokenMinLength {
			return nil, fmt.Errorf("token file %s: the token has %d characters; use at least %d (such as the output of `openssl rand -hex 32`)", tokenFile, len(a.token), TokenMinLength)
		}
	}
	return a, nil
}

// ParsePasswords reads user:password lines.
func ParsePasswords(r io.Reader) (map[string]string, error) {
	users := map[string]string{}
	sc := bufio.NewScanner(r)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		user, pass, ok := strings.Cut(line, ":")
		switch {
		case !ok:
			return nil, fmt.Errorf("line %d: want user:password", n)
		case user == "" || strings.ContainsAny(user, " \t"):
			return nil, fmt.Errorf("line %d: the user name must not be empty nor hold spaces", n)
		case pass == "":
			return nil, fmt.Errorf("line %d: user %q has an empty password", n, user)
		}
		if _, dup := users[user]; dup {
			return nil, fmt.Errorf("line %d: user %q appears twice", n, user)
		}
		if isBcrypt(pass) {
			if _, err := bcrypt.Cost([]byte(pass)); err != nil {
				return nil, fmt.Errorf("line %d: user %q: bad bcrypt hash: %v", n, user, err)
			}
		}
		users[user] = pass
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if len(users) == 0 {
		return nil, fmt.Errorf("no user:password line")
	}
	return users, nil
}

func isBcrypt(s string) bool {
	return strings.HasPrefix(s, "$2a$") || strings.HasPrefix(s, "$2b$") || strings.HasPrefix(s, "$2y$")
}

// Basic reports whether basic auth is configured.
func (a *Auth) Basic() bool { return a != nil && len(a.users) > 0 }

// Token reports whether a bearer token is configured.
func (a *Auth) Token() bool { return a != nil && a.token != "" }

// identify returns who sent r, and an identity that CSRF tokens are tied to.
func (a *Auth) identify(r *http.Request, now time.Time) (user, identity string, ok bool) {
	if u, p, has := r.BasicAuth(); has && a.Basic() {
		if a.checkPassword(u, p) {
			return u, "basic:" + u, true
		}
		return "", "", false
	}
	if h := r.Header.Get("Authorization"); a.Token() && len(h) > 7 && strings.EqualFold(h[:7], "Bearer ") {
		if subtle.ConstantTimeCompare([]byte(strings.TrimSpace(h[7:])), []byte(a.token)) == 1 {
			return "token", "bearer", true
		}
		return "", "", false
	}
	if c, err := r.Cookie(sessionCookie); err == nil && a.Token() {
		a.mu.Lock()
		s, found := a.sessions[c.Value]
		if found && now.After(s.expires) {
			delete(a.sessions, c.Value)
			found = false
		}
		a.mu.Unlock()
		if found {
			return "token", "session:" + c.Value, true
		}
	}
	return "", "", false
}

func (a *Auth) checkPassword(user, pass string) bool {
	want, ok := a.users[user]
	if !ok {
		// Spend the time of a comparison anyway.
		subtle.ConstantTimeCompare([]byte(pass), []byte(pass))
		return false
	}
	if !isBcrypt(want) {
		return subtle.ConstantTimeCompare([]byte(pass), []byte(want)) == 1
	}
	// bcrypt takes tens of milliseconds and a browser sends the password
	// with every request: remember what passed.
	sum := sha256.Sum256([]byte(user + "\x00" + pass + "\x00" + want))
	a.mu.Lock()
	ok = a.verified[sum]
	a.mu.Unlock()
	if ok {
		return true
	}
	if bcrypt.CompareHashAndPassword([]byte(want), []byte(pass)) != nil {
		return false
	}
	a.mu.Lock()
	if len(a.verified) < sessionsMax {
		a.verified[sum] = true
	}
	a.mu.Unlock()
	return true
}

// signIn checks a token typed into the sign-in page and returns a new
// session ID.
func (a *Auth) signIn(token string, now time.Time) (string, bool) {
	if !a.Token() || subtle.ConstantTimeCompare([]byte(strings.TrimSpace(token)), []byte(a.token)) != 1 {
		return "", false
	}
	id := randomHex(32)
	a.mu.Lock()
	defer a.mu.Unlock()
	if len(a.sessions) >= sessionsMax {
		for k, s := range a.sessions {
			if now.After(s.expires) {
				delete(a.sessions, k)
			}
		}
	}
	if len(a.sessions) >= sessionsMax {
		return "", false
	}
	a.sessions[id] = session{expires: now.Add(SessionTTL)}
	return id, true
}

// signOut ends a session.
func (a *Auth) signOut(id string) {
	a.mu.Lock()
	delete(a.sessions, id)
	a.mu.Unlock()
}

func randomHex(n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		panic(err) // crypto/rand does not fail on supported systems
	}
	return hex.EncodeToString(b)
}

// csrf makes and checks the tokens of action forms: an HMAC of the user's
// identity under a secret made at start-up.
type csrf struct{ secret []byte }

func newCSRF() csrf {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		panic(err)
	}
	return csrf{secret: b}
}

func (c csrf) token(identity string) string {
	m := hmac.New(sha256.New, c.secret)
	m.Write([]byte("outbox-console-csrf\x00" + identity))
	return base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}

func (c csrf) valid(identity, token string) bool {
	return token != "" && hmac.Equal([]byte(token), []byte(c.token(identity)))
}

// ListenIsLoopback reports whether a host:port listen address binds only
// loopback interfaces: localhost, 127.0.0.0/8 or ::1. An empty host (every
// interface) or any other name or address is not.
func ListenIsLoopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	return isLoopbackHost(host)
}

func isLoopbackHost(host string) bool {
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// loopbackClient reports whether r came from a loopback address and named a
// loopback host (a DNS-rebinding page names its own host).
func loopbackClient(r *http.Request) bool {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return false
	}
	ip := net.ParseIP(host)
	if ip == nil || !ip.IsLoopback() {
		return false
	}
	h := r.Host
	if hh, _, err := net.SplitHostPort(h); err == nil {
		h = hh
	}
	return isLoopbackHost(strings.Trim(h, "[]"))
}
