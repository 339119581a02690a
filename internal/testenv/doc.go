// Package testenv starts real servers for tests, inside the test process
// itself: no Docker, no externally managed services.
//
// The parts that need no test (starting PostgreSQL and NATS, running
// external processes, stopping servers at exit) live in internal/servers,
// which the `outbox` CLI uses for its demo and bench; this package builds the
// test-only parts on top of it and re-exports the servers API under its old
// names ([StartPostgres], [PostgresOptions], [StartNATS], [ProcConfig],
// [StartProc], [RunProc], [FreePort], …), so that tests need only this
// package.
//
// Servers come in two flavours:
//
//   - Shared, process-wide servers (PostgreSQL, RabbitMQ, dynalite) are
//     started lazily on first use, once per test binary, and stopped by
//     [Main]. Tests get isolation by asking for their own database
//     ([PostgresDSN]) or their own object names ([Name]).
//   - Per-test servers ([NATS], [Kafka]) are started for one test and shut
//     down by t.Cleanup.
//
// A package using the shared servers must run its tests through [Main]:
//
//	func TestMain(m *testing.M) { testenv.Main(m) }
//
// [Main] stops every server the process started, through this package or
// directly through internal/servers (servers.StopAll), and fails the test
// binary if goroutines leak.
//
// External server binaries are run with [StartProc] (servers.StartProc),
// which ties the child to the test process (it is SIGKILLed if the test
// process dies, e.g. on a -timeout panic), optionally runs it as another
// system user, and captures its output in a log file whose tail is attached
// to errors.
//
// # Adding a server
//
// The non-test starter goes where its users are: into internal/servers if the
// CLI needs it (that package must not import testing or any other test-only
// package; a test of it checks that the `outbox` binary links none), or else
// into its own file of this package (as RabbitMQ, dynalite and Kafka are).
// Either way it follows the PostgreSQL pattern in internal/servers'
// postgres.go:
//
//   - a non-test StartX(ctx, opts) (…, stop func() error, error) that creates a
//     directory with servers.NewServerDir, picks a port with
//     servers.FreePort, starts the binary with servers.StartProc, waits with
//     Proc.WaitReady using a client-level probe, and registers its stop
//     function with servers.AtExit so that [Main] stops it even if the caller
//     does not;
//   - in this package, a lazy[T] variable plus an accessor XDSN(t testing.TB)
//     that calls requireMain(t) and starts the server once per process via
//     lazy.get (see postgres.go);
//   - errors for missing binaries that name the install command.
package testenv
