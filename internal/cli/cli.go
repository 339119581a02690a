// Package cli implements the outbox command: migrate, relay, status, dlq,
// console, demo and bench (see [commands] for the list). cmd/outbox/main.go only calls [Main].
//
// Commands get their output writers, logger and environment from an [Env],
// so tests run them in-process with [Run].
//
// # Flags and environment
//
// Every flag can also be set with an environment variable named OUTBOX_ plus
// the flag name in upper case with '-' as '_' (--store: OUTBOX_STORE,
// --http-addr: OUTBOX_HTTP_ADDR), or in the YAML file named by --config
// (OUTBOX_CONFIG) with the flag name as key (see config.go). A flag on the
// command line beats the variable, which beats the file, which beats the
// default. An empty variable counts as unset. --yes is the exception: it is
// only read from the command line, so that no leftover variable or file can
// confirm a purge. --print-config prints the effective configuration, secrets
// hidden, with where each value came from.
//
// # Exit codes
//
// 0 success; 1 a runtime failure (a server that does not answer, a failed
// query); 2 a usage or configuration error (an unknown flag or command, a bad
// URL or value), with a one-line message on stderr naming the flag and what to
// change.
package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"golang.org/x/term"

	"github.com/outboxrelay/outbox/internal/backends"
	"github.com/outboxrelay/outbox/internal/buildinfo"
)

// Exit codes of the outbox command.
const (
	ExitOK      = 0
	ExitFailure = 1
	ExitUsage   = 2
)

// EnvPrefix starts the environment variable of every flag.
const EnvPrefix = "OUTBOX_"

// Env is the outside world of a command run.
type Env struct {
	// Stdout receives results (tables, JSON); Stderr receives logs and the
	// error message. Nil means io.Discard.
	Stdout, Stderr io.Writer
	// Logger receives the commands' logs. Nil: a logger built from
	// --log-format and --log-level, writing to Stderr.
	Logger *slog.Logger
	// LookupEnv reads environment variables; nil means no variables (tests
	// set it; [Main] passes os.LookupEnv).
	LookupEnv func(string) (string, bool)
	// IsTerminal reports whether w is an interactive terminal (progress
	// output is shown only there). Nil means: w is an *os.File on a
	// terminal.
	IsTerminal func(w io.Writer) bool
	// Now is the clock; nil means time.Now.
	Now func() time.Time
}

func (e *Env) withDefaults() {
	if e.Stdout == nil {
		e.Stdout = io.Discard
	}
	if e.Stderr == nil {
		e.Stderr = io.Discard
	}
	if e.LookupEnv == nil {
		e.LookupEnv = func(string) (string, bool) { return "", false }
	}
	if e.IsTerminal == nil {
		e.IsTerminal = isTerminal
	}
	if e.Now == nil {
		e.Now = time.Now
	}
}

// isTerminal reports whether w is a file on a terminal.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}

// Main runs the outbox command with the process's arguments, standard
// streams and environment, and returns the exit code. SIGINT and SIGTERM
// cancel the command's context (the relay then stops gracefully); a second
// signal kills the process.
func Main(args []string) int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	// Once the first signal arrived, restore the default handling so that a
	// second one ends the process at once.
	context.AfterFunc(ctx, stop)
	return Run(ctx, args, Env{Stdout: os.Stdout, Stderr: os.Stderr, LookupEnv: os.LookupEnv})
}

// Run runs the outbox command with args (without the program name) and
// returns the exit code. The error, if any, is printed to env.Stderr as one
// line.
func Run(ctx context.Context, args []string, env Env) int {
	env.withDefaults()
	a := &app{env: env}
	root := a.rootCommand()
	root.SetArgs(args)
	err := root.ExecuteContext(ctx)
	if err == nil || errors.Is(err, errPrinted) {
		return ExitOK
	}
	code := ExitFailure
	if !a.running || isUsage(err) {
		code = ExitUsage
	}
	name := "outbox"
	if a.cmd != nil {
		name = a.cmd.CommandPath()
	}
	msg := strings.Join(strings.Fields(strings.ReplaceAll(err.Error(), "\n", "; ")), " ")
	fmt.Fprintf(env.Stderr, "%s: %s\n", name, msg)
	return code
}

// app is the state shared by the commands of one run.
type app struct {
	env Env
	log *slog.Logger

	logFormat string
	logLevel  string

	cmd     *cobra.Command // the command being run
	running bool           // its RunE has started: later errors are runtime failures unless marked as usage

	configPath string            // --config
	configFile string            // the configuration file read, if any
	printOnly  bool              // --print-config
	origins    map[string]origin // flag name → where its value came from
}

// usageError marks an error as a usage or configuration mistake (exit 2).
type usageError struct{ err error }

func (e *usageError) Error() string { return e.err.Error() }
func (e *usageError) Unwrap() error { return e.err }

// usagef returns a usage error.
func usagef(format string, args ...any) error {
	return &usageError{fmt.Errorf(format, args...)}
}

func isUsage(err error) bool {
	var ue *usageError
	return errors.As(err, &ue) || backends.IsConfigError(err)
}

func (a *app) rootCommand() *cobra.Command {
	root := &cobra.Command{
		Use:   "outbox",
		Short: "Relay messages from a transactional outbox to a message broker",
		Long: `outbox drains a transactional outbox (messages an application wrote in its
own database transactions) to a message broker: at least once, in commit order
per key, with retries and dead letters.

Every flag can also be set with an environment variable: OUTBOX_ plus the
flag name in upper case with '-' as '_' (--store: OUTBOX_STORE), or in a YAML
file given with --config whose keys are the flag names (workers: 8). A flag on
the command line beats the variable, which beats the file. --print-config
shows the effective configuration and where each value came from.

Exit codes: 0 ok, 1 runtime failure, 2 usage or configuration error.`,
		SilenceErrors:     true,
		SilenceUsage:      true,
		CompletionOptions: cobra.CompletionOptions{HiddenDefaultCmd: true},
		PersistentPreRunE: a.prepare,
		Version:           buildinfo.Read().String(),
	}
	root.SetVersionTemplate("{{.Version}}\n")
	root.SetOut(a.env.Stdout)
	root.SetErr(a.env.Stderr)
	root.SetFlagErrorFunc(func(c *cobra.Command, err error) error {
		return usagef("%v%s (see %s --help)", err, flagSuggestion(c, err), c.CommandPath())
	})
	pf := root.PersistentFlags()
	pf.StringVar(&a.logFormat, "log-format", "text", "log format: text or json")
	pf.StringVar(&a.logLevel, "log-level", "info", "log level: debug, info, warn or error")
	pf.StringVar(&a.configPath, configFlag, "", "read settings from this YAML file: keys are the flag names (workers: 8); a flag or environment variable beats the file")
	pf.BoolVar(&a.printOnly, "print-config", false, "print the effective configuration, secrets hidden, with where each value came from, and exit")

	for _, newCmd := range commands {
		if c := newCmd(a); c != nil { // nil: left out of this build (outbox_slim)
			root.AddCommand(c)
		}
	}
	documentEnv(root)
	return root
}

// prepare runs before every command: it applies the environment variables to
// the flags not given, then builds the logger.
func (a *app) prepare(cmd *cobra.Command, _ []string) error {
	a.cmd = cmd
	if err := a.loadConfig(cmd); err != nil {
		return err
	}
	log, err := a.buildLogger()
	if err != nil {
		return err
	}
	a.log = log
	if a.printOnly {
		if err := a.printConfig(cmd); err != nil {
			return err
		}
		return errPrinted
	}
	return nil
}

// envName returns the environment variable of a flag.
func envName(flag string) string {
	return EnvPrefix + strings.ToUpper(strings.ReplaceAll(flag, "-", "_"))
}

// documentEnv appends the environment variable to every flag's usage.
func documentEnv(root *cobra.Command) {
	seen := map[*pflag.Flag]bool{}
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		for _, fs := range []*pflag.FlagSet{c.LocalNonPersistentFlags(), c.PersistentFlags()} {
			fs.VisitAll(func(f *pflag.Flag) {
				if seen[f] || notConfigurable[f.Name] && f.Name != configFlag {
					return
				}
				seen[f] = true
				f.Usage += " [$" + envName(f.Name) + "]"
			})
		}
		for _, sub := range c.Commands() {
			walk(sub)
		}
	}
	walk(root)
}

// buildLogger returns env.Logger, or a logger for --log-format and
// --log-level writing to Stderr.
func (a *app) buildLogger() (*slog.Logger, error) {
	var level slog.Level
	if err := level.UnmarshalText([]byte(a.logLevel)); err != nil {
		return nil, usagef("%s must be debug, info, warn or error, got %q", a.flagRef("log-level"), a.logLevel)
	}
	opts := &slog.HandlerOptions{Level: level}
	var h slog.Handler
	switch a.logFormat {
	case "text":
		h = slog.NewTextHandler(a.env.Stderr, opts)
	case "json":
		h = slog.NewJSONHandler(a.env.Stderr, opts)
	default:
		return nil, usagef("%s must be text or json, got %q", a.flagRef("log-format"), a.logFormat)
	}
	if a.env.Logger != nil {
		return a.env.Logger, nil
	}
	return slog.New(h), nil
}

// run wraps a command's body: errors returned after it starts are runtime
// failures unless marked as usage errors.
func (a *app) run(body func(ctx context.Context, cmd *cobra.Command, args []string) error) func(*cobra.Command, []string) error {
	return func(cmd *cobra.Command, args []string) error {
		a.running = true
		return body(cmd.Context(), cmd, args)
	}
}
