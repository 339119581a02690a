package cli

import (
	"context"
	"net/http"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/outboxrelay/outbox"
	"github.com/outboxrelay/outbox/internal/backends"
	"github.com/outboxrelay/outbox/internal/console"
)

// ConsoleAddrDefault is where `outbox console` listens unless --http-addr
// says otherwise.
const ConsoleAddrDefault = "127.0.0.1:9080"

// consoleFlags are the console's flags; on the relay they start with
// "console-" and --console turns the console on.
type consoleFlags struct {
	prefix        string
	enabled       bool
	readOnly      bool
	basicAuthFile string
	tokenFile     string
}

func (cf *consoleFlags) add(fs *pflag.FlagSet, prefix string) {
	cf.prefix = prefix
	if prefix != "" {
		fs.BoolVar(&cf.enabled, "console", false, "serve the web console on --http-addr, beside /metrics")
	}
	fs.BoolVar(&cf.readOnly, prefix+"read-only", false, "console: show no action (no requeue, no purge) and refuse every change")
	fs.StringVar(&cf.basicAuthFile, prefix+"basic-auth-file", "", "console: require HTTP basic auth with the user:password lines of this file (bcrypt hashes as htpasswd -B writes them work too)")
	fs.StringVar(&cf.tokenFile, prefix+"token-file", "", "console: require the bearer token in this file (scripts send Authorization: Bearer; browsers sign in once)")
}

// checkConsole loads the console's credentials and refuses to serve it
// beyond loopback without them. It returns nil without a console.
func (a *app) checkConsole(cf *consoleFlags, addr string) (*console.Auth, error) {
	if cf.prefix != "" && !cf.enabled {
		return nil, nil
	}
	if addr == "" {
		what, example := "the console", ConsoleAddrDefault
		if cf.prefix != "" {
			what, example = a.flagRef("console"), HTTPAddrDefault
		}
		return nil, usagef("%s needs %s: give the address to serve it on, such as %s", what, a.flagRef("http-addr"), example)
	}
	auth, err := console.LoadAuth(cf.basicAuthFile, cf.tokenFile)
	if err != nil {
		return nil, usagef("%s / %s: %v", a.flagRef(cf.prefix+"basic-auth-file"), a.flagRef(cf.prefix+"token-file"), err)
	}
	if auth == nil && !console.ListenIsLoopback(addr) {
		return nil, usagef("%s %s listens beyond loopback, and the console changes the outbox: give %s or %s, or listen on 127.0.0.1",
			a.flagRef("http-addr"), addr, a.flagRef(cf.prefix+"basic-auth-file"), a.flagRef(cf.prefix+"token-file"))
	}
	return auth, nil
}

// newConsoleServer builds the console of a store, with the relay of this
// process when live is not nil.
func (a *app) newConsoleServer(cf *consoleFlags, auth *console.Auth, storeURL string, store outbox.Source, live console.Live) (*console.Server, error) {
	return console.New(console.Options{
		Store:     store,
		StoreKind: storeScheme(storeURL),
		Live:      live,
		ReadOnly:  cf.readOnly,
		Auth:      auth,
		Logger:    a.log,
		Now:       a.env.Now,
	})
}

// relayConsole returns the console handler of `outbox relay --console`, or
// nil without --console, and a function that stops it.
func (a *app) relayConsole(cf *consoleFlags, auth *console.Auth, storeURL string, store outbox.Source, relay *outbox.Relay) (http.Handler, func(), error) {
	if !cf.enabled {
		return nil, func() {}, nil
	}
	srv, err := a.newConsoleServer(cf, auth, storeURL, store, console.RelayLive(relay))
	if err != nil {
		return nil, nil, err
	}
	a.log.Info("console enabled", "read_only", cf.readOnly, "basic_auth", auth.Basic(), "token", auth.Token())
	return srv.Handler(), srv.Close, nil
}

func newConsoleCommand(a *app) *cobra.Command {
	var (
		sf       storeFlags
		cf       consoleFlags
		httpAddr string
	)
	cmd := &cobra.Command{
		Use:   "console --store URL [--http-addr ADDR]",
		Short: "Serve the web console: watch the outbox, requeue and purge dead letters",
		Long: `console serves a web console for an outbox until it gets SIGINT or SIGTERM:
the backlog per topic and partition with live charts, the live relays and
their leases, the dead letters (filter, page, open one, requeue or purge with
a confirmation), and a search for one message by ID or key.

It reads the store only: throughput and blocked destinations are known to a
running relay, whose own console (outbox relay --console) shows them.

Listening beyond loopback requires --basic-auth-file or --token-file.
--read-only shows no action and refuses every change. Every action is logged
with the user who did it.`,
		Example: `  outbox console --store postgres://app@localhost:5432/app
  outbox console --store … --http-addr 0.0.0.0:9080 --basic-auth-file /etc/outbox/console.passwd
  outbox console --store sqlite://outbox.db --read-only`,
		Args: cobra.NoArgs,
	}
	fs := cmd.Flags()
	sf.add(fs, storeFlagSet{})
	fs.StringVar(&httpAddr, "http-addr", ConsoleAddrDefault, "serve the console here (host:port; port 0 picks one)")
	cf.add(fs, "")
	cmd.RunE = a.run(func(ctx context.Context, cmd *cobra.Command, _ []string) error {
		if err := a.checkHTTPAddr(httpAddr); err != nil {
			return err
		}
		auth, err := a.checkConsole(&cf, httpAddr)
		if err != nil {
			return err
		}
		openCtx, cancel := context.WithTimeout(ctx, time.Minute)
		defer cancel()
		if err := backends.CheckStoreExists(sf.url); err != nil {
			return err
		}
		store, err := sf.open(openCtx, a)
		if err != nil {
			return err
		}
		defer a.closeStore(store)
		srv, err := a.newConsoleServer(&cf, auth, sf.url, store, nil)
		if err != nil {
			return err
		}
		defer srv.Close()
		hs, err := a.listenHTTP(httpAddr, srv.Handler())
		if err != nil {
			return err
		}
		a.log.Info("console serving", "store", storeScheme(sf.url), "read_only", cf.readOnly, "basic_auth", auth.Basic(), "token", auth.Token())
		<-ctx.Done()
		return hs.shutdown(httpShutdownTimeout)
	})
	return cmd
}
