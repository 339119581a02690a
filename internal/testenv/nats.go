package testenv

import (
	"errors"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// natsStartTimeout bounds how long an embedded NATS server may take to accept
// connections.
const natsStartTimeout = 10 * time.Second

// NATS starts an embedded NATS server with JetStream enabled (file storage in
// a temporary directory of the test) for this test. It listens on 127.0.0.1,
// on a random port; s.ClientURL() gives the URL to connect to. The server is
// shut down, and waited for, by t.Cleanup. If it cannot be started, NATS calls
// t.Fatalf.
func NATS(t testing.TB) *server.Server {
	t.Helper()
	s, stop, err := StartNATS(t.TempDir())
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	t.Cleanup(stop)
	return s
}

// StartNATS starts an embedded NATS server with JetStream enabled, outside of
// tests (such as the `outbox demo` and `outbox bench` commands), listening on
// 127.0.0.1 on a random port. JetStream stores its files in storeDir, or, if
// storeDir is "", in a new temporary directory removed on stop.
//
// The returned stop function shuts the server down, waits for it to finish
// and removes the temporary directory; it is idempotent, and Main calls it if
// the caller has not.
func StartNATS(storeDir string) (*server.Server, func(), error) {
	tempDir := ""
	if storeDir == "" {
		dir, err := NewServerDir("", "nats", nil)
		if err != nil {
			return nil, nil, err
		}
		storeDir, tempDir = dir, dir
	}
	removeTemp := func() error {
		if tempDir == "" {
			return nil
		}
		return os.RemoveAll(tempDir)
	}

	s, err := server.NewServer(&server.Options{
		ServerName: "testenv",
		Host:       "127.0.0.1",
		Port:       server.RANDOM_PORT,
		JetStream:  true,
		StoreDir:   storeDir,
		NoLog:      true,
		NoSigs:     true,
	})
	if err != nil {
		return nil, nil, errors.Join(fmt.Errorf("nats: %w", err), removeTemp())
	}
	shutdown := func() error {
		s.Shutdown()
		s.WaitForShutdown()
		return removeTemp()
	}
	s.Start()
	if !s.ReadyForConnections(natsStartTimeout) {
		return nil, nil, errors.Join(fmt.Errorf("nats: server not ready for connections within %v", natsStartTimeout), shutdown())
	}
	if !s.JetStreamEnabled() {
		return nil, nil, errors.Join(errors.New("nats: JetStream did not start"), shutdown())
	}
	stop := atExit("nats", shutdown)
	return s, func() { _ = stop() }, nil
}
