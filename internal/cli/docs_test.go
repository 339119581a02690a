package cli_test

import (
	"bufio"
	"context"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/nats-io/nkeys"

	"github.com/outboxrelay/outbox/internal/cli"
	"github.com/outboxrelay/outbox/internal/testenv"
)

// docCommand is a shell command of a fenced sh block of the documentation.
type docCommand struct {
	file string
	line int
	text string
}

// docCommands returns the commands of the sh, bash and shell blocks of
// README.md and docs/*.md, with continued lines joined.
func docCommands(t *testing.T) []docCommand {
	t.Helper()
	files, err := filepath.Glob("../../docs/*.md")
	if err != nil {
		t.Fatal(err)
	}
	files = append([]string{"../../README.md"}, files...)
	var out []docCommand
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		in, lang := false, ""
		var cont *docCommand
		sc := bufio.NewScanner(strings.NewReader(string(b)))
		n := 0
		for sc.Scan() {
			n++
			l := sc.Text()
			if trimmed := strings.TrimSpace(l); strings.HasPrefix(trimmed, "```") {
				in, lang = !in, strings.TrimSpace(strings.TrimPrefix(trimmed, "```"))
				continue
			}
			if !in || (lang != "sh" && lang != "bash" && lang != "shell") {
				continue
			}
			if cont != nil {
				cont.text += " " + strings.TrimSpace(strings.TrimSuffix(l, `\`))
			} else if s := strings.TrimSpace(l); s != "" && !strings.HasPrefix(s, "#") {
				out = append(out, docCommand{file: filepath.Base(f), line: n, text: strings.TrimSuffix(s, `\`)})
				cont = &out[len(out)-1]
			}
			if !strings.HasSuffix(l, `\`) {
				cont = nil
			}
		}
	}
	return out
}

// shellWords splits a command line as sh would: quotes, backslashes, a
// comment from an unquoted '#' at the start of a word; it stops at a
// redirection or a pipe (the rest is not the command's).
func shellWords(s string) []string {
	var words []string
	var w strings.Builder
	inWord := false
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '\'':
			j := strings.IndexByte(s[i+1:], '\'')
			w.WriteString(s[i+1 : i+1+j])
			i += j + 1
			inWord = true
		case c == '"':
			j := strings.IndexByte(s[i+1:], '"')
			w.WriteString(s[i+1 : i+1+j])
			i += j + 1
			inWord = true
		case c == '\\' && i+1 < len(s):
			i++
			w.WriteByte(s[i])
			inWord = true
		case c == ' ' || c == '\t':
			if inWord {
				words = append(words, w.String())
				w.Reset()
				inWord = false
			}
		case !inWord && (c == '#' || c == '>' || c == '|' || c == '&'):
			return words
		default:
			w.WriteByte(c)
			inWord = true
		}
	}
	if inWord {
		words = append(words, w.String())
	}
	return words
}

// TestDocumentedCommandsParse runs every outbox command of README.md and
// docs/*.md (and go run ./cmd/outbox …) through the real command, flags,
// configuration and every check it makes before its first I/O, with its
// context already cancelled so that none connects or runs long: a usage
// error (exit 2) fails the test, as a renamed flag, scenario or subcommand
// would. Placeholders (…, $DATABASE_URL) become unreachable local URLs.
// Commands that need Docker, systemd or root (docker, systemctl,
// journalctl, install) and the build commands are listed as skipped, not
// run. TestDocumentedCommandsRun (docs_run_test.go) runs them all, to the
// end, against servers it starts; this test is the quick check of the
// same commands' flags.
func TestDocumentedCommandsParse(t *testing.T) {
	t.Parallel()
	vars := map[string]string{
		"$DATABASE_URL": "postgres://app@127.0.0.1:1/app",
		"$DB":           "postgres://app@127.0.0.1:1/app",
		"$BROKER":       "nats://127.0.0.1:1",
	}
	files := docFiles(t)
	placeholder := map[string]string{
		"--store":  "postgres://app@127.0.0.1:1/app",
		"--broker": "nats://127.0.0.1:1",
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	ran := 0
	for _, c := range docCommands(t) {
		words := shellWords(c.text)
		env := map[string]string{}
		for len(words) > 0 && strings.Contains(words[0], "=") && !strings.HasPrefix(words[0], "-") {
			k, v, _ := strings.Cut(words[0], "=")
			if strings.HasSuffix(k, "_FILE") || strings.Contains(v, "/etc/outbox/") || strings.Contains(v, "/run/secrets/") {
				v = files(v) // a path, not a value such as a ratio
			}
			env[k] = v
			words = words[1:] // VAR=value before the command
		}
		var args []string
		switch {
		case len(words) >= 1 && words[0] == "outbox":
			args = words[1:]
		case len(words) >= 3 && words[0] == "go" && words[1] == "run" && words[2] == "./cmd/outbox":
			args = words[3:]
		default:
			t.Logf("skipped %s:%d (not an outbox command, or needs Docker, systemd or root): %s", c.file, c.line, c.text)
			continue
		}
		for i, a := range args {
			if v, ok := vars[a]; ok {
				args[i] = v
			}
			if i > 0 && strings.HasSuffix(args[i-1], "-file") || strings.Contains(a, "/etc/outbox/") || strings.Contains(a, "/run/secrets/") {
				args[i] = files(a)
			}
			if strings.Contains(a, "…") && i > 0 {
				if v, ok := placeholder[args[i-1]]; ok {
					args[i] = v
				}
			}
		}
		var stdout, stderr syncBuffer
		code := cli.Run(ctx, args, cli.Env{Stdout: &stdout, Stderr: &stderr, LookupEnv: lookup(env)})
		ran++
		if code == cli.ExitUsage {
			t.Errorf("%s:%d: `%s` is a usage error:\n%s", c.file, c.line, c.text, stderr.String())
		}
	}
	if ran < 15 {
		t.Fatalf("ran %d documented commands; the extraction finds too few", ran)
	}
	t.Logf("ran %d documented commands", ran)
}

// docFiles returns a function that turns a file path of the documentation
// (/etc/outbox/nats-ca.pem, relay.nk, /run/secrets/amqp-password, or such
// paths inside a URL) into a file of a temporary directory with content of
// its kind: a CA certificate, a client certificate or key, an nkey seed, a
// one-line secret.
func docFiles(t *testing.T) func(string) string {
	pki := testenv.NewPKI(t, "docs")
	client := pki.Client("relay")
	seed, err := nkeys.CreateUser()
	if err != nil {
		t.Fatal(err)
	}
	seedText, err := seed.Seed()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	content := func(name string) []byte {
		ca, _ := os.ReadFile(pki.CAFile)
		switch {
		case strings.Contains(name, "ca"):
			return ca
		case strings.HasSuffix(name, "key.pem"):
			return client.KeyPEM
		case strings.HasSuffix(name, ".pem"):
			return client.CertPEM
		case strings.HasSuffix(name, ".nk"):
			return seedText
		}
		return []byte("documented-secret\n")
	}
	pathRe := regexp.MustCompile(`(/etc/outbox/|/run/secrets/)?[A-Za-z0-9._-]+`)
	return func(v string) string {
		return pathRe.ReplaceAllStringFunc(v, func(p string) string {
			if !strings.HasPrefix(p, "/") && v != p {
				return p // a word of a URL, not a file
			}
			name := filepath.Base(p)
			local := filepath.Join(dir, name)
			if err := os.WriteFile(local, content(name), 0o600); err != nil {
				t.Fatal(err)
			}
			return local
		})
	}
}
