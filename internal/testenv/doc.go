// Package testenv starts real servers for tests, inside the test process
// itself: no Docker, no externally managed services.
//
// Servers come in two flavours:
//
//   - Shared, process-wide servers (PostgreSQL) are started lazily on first
//     use, once per test binary, and stopped by [Main]. Tests get isolation by
//     asking for their own database ([PostgresDSN]) or their own object names
//     ([Name]).
//   - Per-test servers ([NATS]) are started for one test and shut down by
//     t.Cleanup.
//
// A package using the shared servers must run its tests through [Main]:
//
//	func TestMain(m *testing.M) { testenv.Main(m) }
//
// [Main] also fails the test binary if goroutines leak.
//
// External server binaries are run with [StartProc], which ties the child to
// the test process (it is SIGKILLed if the test process dies, e.g. on a
// -timeout panic), optionally runs it as another system user, and captures
// its output in a log file whose tail is attached to errors.
//
// # Adding a server
//
// A new external server (RabbitMQ, dynalite, Kafka, ...) goes into its own
// file of this package and follows the PostgreSQL pattern in postgres.go:
//
//   - a non-test StartX(ctx, opts) (…, stop func() error, error) that creates a
//     directory with [NewServerDir], picks a port with [FreePort], starts the
//     binary with [StartProc], waits with [Proc.WaitReady] using a client-level
//     probe, and registers its stop function with atExit so that [Main] stops
//     it even if the caller does not;
//   - a lazy[T] variable plus an accessor XDSN(t testing.TB) that calls
//     requireMain(t) and starts the server once per process via lazy.get;
//   - errors for missing binaries that name the install command.
package testenv
