package servers

import (
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// natsStartTimeout bounds how long an embedded NATS server may take to accept
// connections.
const natsStartTimeout = 10 * time.Second

// StartNATS starts an embedded NATS server with JetStream enabled, outside of
// tests (such as the `outbox demo` and `outbox bench` commands), listening on
// 127.0.0.1 on a random port; the server's ClientURL method gives the URL to
// connect to. JetStream stores its files in storeDir, or, if storeDir is "",
// in a new temporary directory removed on stop. Within tests, use
// testenv.NATS, which stops the server at the end of the test.
//
// The returned stop function shuts the server down, waits for it to finish
// and removes the temporary directory; it is idempotent, safe for concurrent
// use, and registered with [AtExit], so that [StopAll] (which testenv.Main
// calls) stops the server if the caller has not.
func StartNATS(storeDir string) (*server.Server, func(), error) {
	return StartNATSOn(storeDir, server.RANDOM_PORT)
}

// StartNATSOn is [StartNATS] listening on port of 127.0.0.1 (a port a
// stopped server used, to start it again at the same address).
func StartNATSOn(storeDir string, port int) (*server.Server, func(), error) {
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
		ServerName: "outbox",
		Host:       "127.0.0.1",
		Port:       port,
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
	stop := AtExit("nats", shutdown)
	return s, func() { _ = stop() }, nil
}
