package testenv

import (
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/outboxrelay/outbox/internal/servers"
)

// NATS starts an embedded NATS server with JetStream enabled (file storage in
// a temporary directory of the test) for this test. It listens on 127.0.0.1,
// on a random port; s.ClientURL() gives the URL to connect to. The server is
// shut down, and waited for, by t.Cleanup. If it cannot be started, NATS calls
// t.Fatalf.
func NATS(t testing.TB) *server.Server {
	t.Helper()
	s, stop, err := servers.StartNATS(t.TempDir())
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	t.Cleanup(stop)
	return s
}

// StartNATS is [servers.StartNATS]: it starts an embedded NATS server with
// JetStream enabled outside of a test's lifetime, registered for [Main] to
// stop. Within tests, use [NATS].
func StartNATS(storeDir string) (*server.Server, func(), error) {
	return servers.StartNATS(storeDir)
}

// NATSWith starts an embedded NATS server with JetStream for this test,
// configured by opts (TLS, authorization, operator mode, …); Host, Port,
// JetStream, StoreDir, NoLog and NoSigs are set by NATSWith. The server is
// shut down by t.Cleanup.
func NATSWith(t testing.TB, opts server.Options) *server.Server {
	t.Helper()
	opts.ServerName = "outbox-" + Name(t)
	opts.Host = "127.0.0.1"
	opts.Port = server.RANDOM_PORT
	opts.JetStream = true
	opts.StoreDir = t.TempDir()
	opts.NoLog, opts.NoSigs = true, true
	s, err := server.NewServer(&opts)
	if err != nil {
		t.Fatalf("testenv: nats: %v", err)
	}
	s.Start()
	t.Cleanup(func() {
		s.Shutdown()
		s.WaitForShutdown()
	})
	if !s.ReadyForConnections(natsStartTimeout) {
		t.Fatalf("testenv: nats: server not ready for connections within %v", natsStartTimeout)
	}
	return s
}

// natsStartTimeout bounds how long NATSWith waits for the server.
const natsStartTimeout = 10 * time.Second
