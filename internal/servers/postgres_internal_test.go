package servers

import (
	"context"
	"net"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestStartPostgresRetriesTakenPort checks that StartPostgres moves to
// another port when the one it picked was taken meanwhile, both by a plain
// listener and by another PostgreSQL server, which, as it also trusts user
// postgres, would accept the readiness probe's connection.
func TestStartPostgresRetriesTakenPort(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	listenerPort := l.Addr().(*net.TCPAddr).Port

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	otherDSN, stopOther, err := StartPostgres(ctx, PostgresOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := stopOther(); err != nil {
			t.Error(err)
		}
	}()
	u, err := url.Parse(otherDSN)
	if err != nil {
		t.Fatal(err)
	}
	serverPort, err := strconv.Atoi(u.Port())
	if err != nil {
		t.Fatal(err)
	}

	for name, taken := range map[string]int{"listener": listenerPort, "other postgres": serverPort} {
		t.Run(name, func(t *testing.T) {
			calls := 0
			postgresPort = func() (int, error) {
				calls++
				if calls == 1 {
					return taken, nil
				}
				return FreePort()
			}
			defer func() { postgresPort = FreePort }()

			var logs []string
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			dsn, stop, err := StartPostgres(ctx, PostgresOptions{Logf: func(format string, args ...any) {
				t.Logf(format, args...)
				logs = append(logs, format)
			}})
			if err != nil {
				t.Fatal(err)
			}
			defer func() {
				if err := stop(); err != nil {
					t.Error(err)
				}
			}()
			if calls != 2 {
				t.Errorf("picked %d ports, want 2", calls)
			}
			if strings.Contains(dsn, ":"+strconv.Itoa(taken)+"/") {
				t.Errorf("DSN %s uses the taken port %d", dsn, taken)
			}
			if !strings.Contains(strings.Join(logs, "\n"), "taken, retrying") {
				t.Errorf("no retry logged")
			}
		})
	}
}
