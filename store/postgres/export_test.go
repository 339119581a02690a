package postgres

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/url"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxrelay/outbox/internal/testenv"
)

// exampleServer is the DSN of a PostgreSQL server for the examples, which
// cannot take a *testing.T: the shared test server, recorded by setup, or
// one started for the examples alone (when no test ran before them). Main
// stops either.
var exampleServer struct {
	sync.Mutex
	dsn string
}

func rememberServer(dsn string) {
	exampleServer.Lock()
	defer exampleServer.Unlock()
	if exampleServer.dsn == "" {
		exampleServer.dsn = dsn
	}
}

// DatabaseURLForExample returns the URL of a new, empty database for an
// example. The database goes away with the server when the tests end. It
// panics on failure: examples have no *testing.T to fail.
func DatabaseURLForExample() string {
	exampleServer.Lock()
	defer exampleServer.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if exampleServer.dsn == "" {
		dsn, _, err := testenv.StartPostgres(ctx, testenv.PostgresOptions{})
		if err != nil {
			panic(err)
		}
		exampleServer.dsn = dsn
	}
	name := fmt.Sprintf("example_%08x", rand.Uint32())
	conn, err := pgx.Connect(ctx, exampleServer.dsn)
	if err != nil {
		panic(err)
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
		panic(err)
	}
	u, err := url.Parse(exampleServer.dsn)
	if err != nil {
		panic(err)
	}
	u.Path = "/" + name
	return u.String()
}
