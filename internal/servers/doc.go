// Package servers starts real servers outside of tests, for the CLI's
// `outbox demo` and `outbox bench` commands, and is the base of
// internal/testenv, which adds the test-only parts (shared servers per test
// process, t.Cleanup, goroutine-leak checks). It must not import testing or
// any other test-only package (a test of this package checks that the
// `outbox` binary links none).
//
// # Servers
//
//   - [StartPostgres] runs a throwaway PostgreSQL cluster from the local
//     server binaries (initdb, postgres), as system user postgres when
//     running as root.
//   - [StartNATS] runs an embedded NATS server with JetStream, in process.
//
// Each returns a stop function, which the caller should call. Every started
// server is also registered with [AtExit], and [StopAll] stops those still
// running: testenv.Main calls it after the tests.
//
// # External processes
//
// External server binaries are run with [StartProc], which ties the child to
// the current process (it is SIGKILLed if the current process dies, e.g. on a
// test's -timeout panic), optionally runs it as another system user
// ([UserCredential]), and captures its output in a log file whose tail is
// attached to errors. [RunProc] runs one-shot commands (such as initdb) the
// same way.
//
// # Adding a server
//
// A starter for a new external server follows the PostgreSQL pattern in
// postgres.go: a StartX(ctx, opts) (…, stop func() error, error) that creates
// a directory with [NewServerDir], picks a port with [FreePort], starts the
// binary with [StartProc], waits with [Proc.WaitReady] using a client-level
// probe (retrying with another port if the picked one was taken), registers
// its stop function with [AtExit], and returns errors for missing binaries
// that name the install command. It goes into this package if the CLI needs
// it, and into internal/testenv (which can use testing) otherwise.
package servers
