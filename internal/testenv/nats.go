package testenv

import (
	"net"
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

// NATSServer is an embedded NATS server (JetStream, file storage) that a
// test stops and starts again at the same address with its data: a broker
// outage. Its methods are called from the test's goroutine.
type NATSServer struct {
	t    testing.TB
	dir  string
	port int
	url  string
	stop func() // nil while stopped
}

// StoppableNATS starts a [NATSServer] for this test, shut down by
// t.Cleanup. It calls t.Fatalf if the server cannot start.
func StoppableNATS(t testing.TB) *NATSServer {
	t.Helper()
	n := &NATSServer{t: t, dir: t.TempDir()}
	s, stop, err := servers.StartNATS(n.dir)
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	n.port, n.url, n.stop = s.Addr().(*net.TCPAddr).Port, s.ClientURL(), stop
	t.Cleanup(func() {
		if n.stop != nil {
			n.stop()
		}
	})
	return n
}

// URL is the server's client URL, the same across restarts.
func (n *NATSServer) URL() string { return n.url }

// Stop shuts the server down and waits for it: clients lose their
// connection and cannot reconnect until Start.
func (n *NATSServer) Stop() {
	n.t.Helper()
	if n.stop == nil {
		n.t.Fatalf("testenv: NATSServer.Stop: already stopped")
	}
	n.stop()
	n.stop = nil
}

// Start starts the server again on the same port with the same store
// directory (streams and messages survive) and returns once it accepts
// connections.
func (n *NATSServer) Start() {
	n.t.Helper()
	if n.stop != nil {
		n.t.Fatalf("testenv: NATSServer.Start: already running")
	}
	_, stop, err := servers.StartNATSOn(n.dir, n.port)
	if err != nil {
		n.t.Fatalf("testenv: restart NATS on port %d: %v", n.port, err)
	}
	n.stop = stop
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
