package redis

import (
	"crypto/tls"
	"fmt"
	"net"
	"net/url"
	"os"
	"strconv"
	"strings"

	"github.com/outboxrelay/outbox/broker/internal/optcheck"
	"github.com/outboxrelay/outbox/internal/redact"
)

// URLParams are the query parameters ParseURL reads into Options.
var URLParams = []string{
	"create_streams",    // CreateStreams (true/false)
	"maxlen",            // MaxLen (MAXLEN ~ N on every XADD)
	"max_message_bytes", // MaxMessageBytes
	"publish_timeout",   // PublishTimeout (a duration: 10s)
	"dial_timeout",      // DialTimeout (a duration: 5s)
	"pool_size",         // PoolSize
	"client_name",       // ClientName
	"password_file",     // Password, read from this file (not in the URL)
}

// ParseURL reads a Redis URL into Options:
//
//	redis://[user[:password]@]host[:port][/db][?param=value...]
//	rediss://…  (the same over TLS, verified against the system's CAs)
//
// The port defaults to DefaultPort, the database to 0. The password may
// instead come from a file (password_file=/run/secrets/redis, one line),
// so that it need not sit in the URL; giving both is an error. The query
// parameters listed in URLParams set the matching fields; unknown ones are
// errors. Errors name the parameter and never show the password.
func ParseURL(raw string) (Options, error) {
	var opts Options
	shown := redact.URL(raw)
	u, err := url.Parse(raw)
	if err != nil {
		return opts, fmt.Errorf("redis: URL %q does not parse; want redis://[user:password@]host:port[/db] (a password with reserved characters such as '@', '/' or '%%' must be percent-encoded, or given with password_file)", shown)
	}
	switch u.Scheme {
	case "redis":
	case "rediss":
		opts.TLS = &tls.Config{MinVersion: tls.VersionTLS12, ServerName: u.Hostname()}
	default:
		return opts, fmt.Errorf("redis: URL %q: want redis:// or rediss://", shown)
	}
	if u.Fragment != "" || u.Opaque != "" {
		return opts, fmt.Errorf("redis: URL %q: want redis://[user:password@]host:port[/db] without a fragment", shown)
	}
	host := u.Host
	if host == "" {
		return opts, fmt.Errorf("redis: URL %q has no host; give redis://host:port", shown)
	}
	if _, _, err := net.SplitHostPort(host); err != nil {
		host = net.JoinHostPort(strings.Trim(host, "[]"), strconv.Itoa(DefaultPort))
	}
	opts.Addr = host
	if u.User != nil {
		opts.Username = u.User.Username()
		opts.Password, _ = u.User.Password()
	}
	if db := strings.Trim(u.Path, "/"); db != "" {
		n, err := strconv.Atoi(db)
		if err != nil || n < 0 {
			return opts, fmt.Errorf("redis: URL %q: the path %q must be a database number such as /0", shown, u.Path)
		}
		opts.DB = n
	}
	subject := fmt.Sprintf("redis: URL %q", shown)
	err = optcheck.Query(u.Query(), subject, URLParams, nil, func(p optcheck.Param) error {
		var err error
		switch p.Name {
		case "create_streams":
			opts.CreateStreams, err = p.Bool()
		case "maxlen":
			var n int
			n, err = p.PositiveInt()
			opts.MaxLen = int64(n)
		case "max_message_bytes":
			opts.MaxMessageBytes, err = p.PositiveInt()
		case "publish_timeout":
			opts.PublishTimeout, err = p.PositiveDuration()
		case "dial_timeout":
			opts.DialTimeout, err = p.PositiveDuration()
		case "pool_size":
			opts.PoolSize, err = p.PositiveInt()
		case "client_name":
			opts.ClientName = p.Value
		case "password_file":
			if opts.Password != "" {
				return fmt.Errorf("%s: password_file and a password in the URL are two passwords; remove one", subject)
			}
			opts.Password, err = readPasswordFile(p.Value)
			if err != nil {
				return fmt.Errorf("%s: password_file: %w", subject, err)
			}
		}
		return err
	})
	return opts, err
}

// readPasswordFile reads a password from path: one line, its trailing
// newline dropped.
func readPasswordFile(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	v := strings.TrimRight(string(b), "\r\n")
	switch {
	case v == "":
		return "", fmt.Errorf("%s is empty; put the password in it", path)
	case strings.ContainsAny(v, "\r\n"):
		return "", fmt.Errorf("%s has more than one line; put only the password in it", path)
	}
	return v, nil
}
