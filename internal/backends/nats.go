package backends

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"

	"github.com/nats-io/nats.go"

	"github.com/outboxrelay/outbox"
	"github.com/outboxrelay/outbox/broker/natsjs"

	"github.com/outboxrelay/outbox/internal/redact"
)

// NATS JetStream broker: nats://[user:password@]host:4222 (tls:// for TLS).
// Query parameters: prefix (subject prefix, such as "outbox."),
// max_in_flight, ack_timeout. Credentials: BrokerOptions.NATS (a .creds
// file, an nkey seed file, a token, a user and password); TLS:
// BrokerOptions.TLS, applied with nats.go's own options.
func init() {
	RegisterBroker("nats", openNATS)
	RegisterBroker("tls", openNATS)
}

func openNATS(ctx context.Context, u *url.URL, o BrokerOptions) (outbox.Publisher, error) {
	if u.Host == "" {
		return nil, Invalid(BrokerFlag, "%q has no host; give a URL such as nats://localhost:4222", redact.URL(u.String()))
	}
	if u.RawQuery != "" {
		return nil, Invalid(BrokerFlag, "%q has query parameters NATS does not know (%s); accepted: prefix, max_in_flight, ack_timeout", redact.URL(u.String()), u.RawQuery)
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	natsOpts, err := natsOptions(o)
	if err != nil {
		return nil, err
	}
	p, err := natsjs.Dial(u.String(), natsjs.Options{
		MaxInFlight:   o.MaxInFlight,
		AckTimeout:    o.AckTimeout,
		SubjectPrefix: o.SubjectPrefix,
		Logger:        o.Logger,
		CloudEvents:   o.CloudEvents,
	}, natsOpts...)
	if err != nil {
		return nil, natsRefusal(err, u, o)
	}
	return p, nil
}

// natsOptions turns the security options into nats.go's own options.
func natsOptions(o BrokerOptions) ([]nats.Option, error) {
	var opts []nats.Option
	if o.TLS.enabled() {
		opts = append(opts, nats.Secure())
	}
	if o.TLS.CAFile != "" {
		opts = append(opts, nats.RootCAs(o.TLS.CAFile))
	}
	if o.TLS.CertFile != "" {
		opts = append(opts, nats.ClientCert(o.TLS.CertFile, o.TLS.KeyFile))
	}
	a := o.NATS
	switch {
	case a.CredsFile != "":
		if _, err := os.Stat(a.CredsFile); err != nil {
			return nil, Invalid("--nats-creds-file", "%v", err)
		}
		opts = append(opts, nats.UserCredentials(a.CredsFile))
	case a.NkeyFile != "":
		opt, err := nats.NkeyOptionFromSeed(a.NkeyFile)
		if err != nil {
			return nil, Invalid("--nats-nkey-file", "%s: %v; give a file holding an nkey seed (SU…)", a.NkeyFile, err)
		}
		opts = append(opts, opt)
	case a.Token != "":
		opts = append(opts, nats.Token(a.Token))
	case a.User != "":
		opts = append(opts, nats.UserInfo(a.User, a.Password))
	}
	return opts, nil
}

// natsRefusal says which credentials or TLS setting the server refused.
func natsRefusal(err error, u *url.URL, o BrokerOptions) error {
	switch {
	case errors.Is(err, nats.ErrAuthorization), errors.Is(err, nats.ErrAuthExpired),
		errors.Is(err, nats.ErrAuthRevoked), errors.Is(err, nats.ErrAccountAuthExpired):
		if len(o.NATS.set()) == 0 {
			if u.User != nil {
				return fmt.Errorf("the NATS server refused the credentials in --broker: %w", err)
			}
			return fmt.Errorf("the NATS server requires credentials; give --nats-creds-file, --nats-nkey-file, --nats-token-file or --nats-user: %w", err)
		}
		return fmt.Errorf("the NATS server refused %s: %w", o.NATS.describe(), err)
	case errors.Is(err, nats.ErrSecureConnRequired):
		return fmt.Errorf("the NATS server requires TLS: use a tls:// URL or give %s or %s: %w", BrokerTLSFlag, BrokerCAFileFlag, err)
	case errors.Is(err, nats.ErrSecureConnWanted):
		return fmt.Errorf("the NATS server does not offer TLS; remove the TLS options: %w", err)
	}
	if why := tlsRefusal(err, o.TLS); why != "" {
		return fmt.Errorf("%s: %w", why, err)
	}
	return err
}
