package cli

import (
	"net/url"
	"strings"

	"github.com/spf13/cobra"
)

// impliedSetting returns the value a setting really has when another
// setting turns it on, and where that comes from, for --print-config:
// broker-tls is on for a tls:// or amqps:// broker and with a CA or client
// certificate file, whatever --broker-tls says.
func impliedSetting(cmd *cobra.Command, name string) (value, source string, ok bool) {
	if name != "broker-tls" {
		return "", "", false
	}
	fs := cmd.Flags()
	if f := fs.Lookup(name); f == nil || f.Value.String() == "true" {
		return "", "", false
	}
	if b := fs.Lookup("broker"); b != nil {
		if u, err := url.Parse(strings.TrimSpace(b.Value.String())); err == nil && (u.Scheme == "tls" || u.Scheme == "amqps") {
			return "true", "implied by --broker " + u.Scheme + "://", true
		}
	}
	for _, file := range []string{"broker-ca-file", "broker-cert-file"} {
		if f := fs.Lookup(file); f != nil && f.Value.String() != "" {
			return "true", "implied by --" + file, true
		}
	}
	return "", "", false
}
