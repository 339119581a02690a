package testenv

import (
	"context"
	"syscall"

	"github.com/outboxrelay/outbox/internal/servers"
)

// The external-process helpers live in internal/servers, which the CLI uses
// too; these names keep them available to tests and to this package's
// starters.

// DefaultStopTimeout is [servers.DefaultStopTimeout], the default of
// ProcConfig.StopTimeout.
const DefaultStopTimeout = servers.DefaultStopTimeout

// ProcConfig is [servers.ProcConfig]: an external server process for
// [StartProc], or a one-shot command for [RunProc].
type ProcConfig = servers.ProcConfig

// Proc is [servers.Proc], a running external server process started by
// [StartProc].
type Proc = servers.Proc

// StartProc is [servers.StartProc]: it starts the process described by cfg,
// tied to the current process, without waiting for it to be ready.
func StartProc(cfg ProcConfig) (*Proc, error) { return servers.StartProc(cfg) }

// RunProc is [servers.RunProc]: it runs a one-shot command to completion.
func RunProc(ctx context.Context, cfg ProcConfig) error { return servers.RunProc(ctx, cfg) }

// FreePort is [servers.FreePort]: a TCP port on 127.0.0.1 that was free a
// moment ago.
func FreePort() (int, error) { return servers.FreePort() }

// UserCredential is [servers.UserCredential]: the credential for running a
// process as system user name when running as root, nil otherwise.
func UserCredential(name string) (*syscall.Credential, error) { return servers.UserCredential(name) }

// NewServerDir is [servers.NewServerDir]: a fresh directory for one server
// called name under base (default os.TempDir()).
func NewServerDir(base, name string, cred *syscall.Credential) (string, error) {
	return servers.NewServerDir(base, name, cred)
}
