package cli

import (
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/knadh/koanf/providers/confmap"
	"github.com/knadh/koanf/providers/posflag"
	"github.com/knadh/koanf/v2"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	yaml "go.yaml.in/yaml/v3"

	"github.com/outboxrelay/outbox/internal/redact"
)

// The configuration file.
//
// YAML, not TOML: the places the relay is deployed to (Kubernetes
// ConfigMaps and Helm values, Compose files, Ansible) speak YAML already, so
// a team can keep the relay's settings next to the rest; and YAML's node API
// gives the line of every key and value, which the errors need. The file is
// a flat mapping whose keys are the flag names (workers: 8, http-addr:
// 127.0.0.1:7467). One file may hold the keys of every command: a command
// uses its own and ignores those of the others, but a key no command knows,
// a list or mapping where one value belongs, or a value of the wrong type is
// an error naming the key and its line.
//
// Precedence, highest first: a flag on the command line, its environment
// variable (OUTBOX_…), the file, the default. github.com/knadh/koanf merges
// the layers; the posflag provider keeps a flag's default from overriding a
// value of a lower layer.

// configFlag is the flag naming the configuration file.
const configFlag = "config"

// notConfigurable lists the flags that come only from the command line:
// --yes must be typed (no leftover variable or file may confirm a purge),
// and the others are about this invocation, not the configuration.
var notConfigurable = map[string]bool{
	"yes": true, "help": true, "version": true, configFlag: true, "print-config": true,
}

// errPrinted stops a command after --print-config printed the
// configuration; Run turns it into exit 0.
var errPrinted = errors.New("configuration printed")

// secretAnnotation marks a flag whose value is a secret: it is never
// printed, only whether it is set.
const secretAnnotation = "outbox_secret"

// markSecret marks flags of fs as secrets.
func markSecret(fs *pflag.FlagSet, names ...string) {
	for _, n := range names {
		if err := fs.SetAnnotation(n, secretAnnotation, []string{"true"}); err != nil {
			panic(err) // a programming mistake: no such flag
		}
	}
}

func isSecret(f *pflag.Flag) bool { _, ok := f.Annotations[secretAnnotation]; return ok }

// display returns a flag value fit to print: a secret masked, a URL (or any
// other string) without its password or token.
func display(f *pflag.Flag, v string) string {
	if isSecret(f) {
		return redact.Secret(v)
	}
	return redact.URL(v)
}

// origin says where a flag's value came from.
type origin struct {
	kind string // "flag", "env", "file" or "default"
	env  string // the variable, for "env"
	line int    // the line in the file, for "file"
}

func (o origin) String() string {
	switch o.kind {
	case "env":
		return "env " + o.env
	case "file":
		return "file line " + strconv.Itoa(o.line)
	}
	return o.kind
}

// configFile is a parsed configuration file.
type configFile struct {
	path   string
	values map[string]string // key → scalar value
	lines  map[string]int    // key → line
}

// readConfigFile reads and checks the configuration file at path: every key
// must be the name of a flag of some command (known), and every value a
// single value that flag accepts.
func readConfigFile(path string, known map[string]*pflag.Flag) (*configFile, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, usagef("--%s: %v", configFlag, err)
	}
	cf := &configFile{path: path, values: map[string]string{}, lines: map[string]int{}}
	var doc yaml.Node
	if err := yaml.Unmarshal(b, &doc); err != nil {
		return nil, usagef("config file %s: %s", path, strings.TrimPrefix(err.Error(), "yaml: "))
	}
	if len(doc.Content) == 0 {
		return cf, nil // empty file
	}
	root := doc.Content[0]
	if root.Kind != yaml.MappingNode {
		return nil, usagef("config file %s line %d: want a mapping of flag names to values, such as \"workers: 8\"", path, root.Line)
	}
	for i := 0; i+1 < len(root.Content); i += 2 {
		k, v := root.Content[i], root.Content[i+1]
		key := k.Value
		at := func(format string, args ...any) error {
			return usagef("config file %s line %d: %s", path, k.Line, fmt.Sprintf(format, args...))
		}
		f, ok := known[key]
		switch {
		case k.Kind != yaml.ScalarNode:
			return nil, at("keys must be flag names, got a %s", kindName(k))
		case notConfigurable[key]:
			return nil, at("%q can only be given on the command line", key)
		case !ok:
			return nil, at("unknown key %q; keys are the flag names without the dashes (see outbox <command> --help)%s", key, suggest(key, known))
		case v.Kind == yaml.AliasNode:
			v = v.Alias
		}
		if _, dup := cf.lines[key]; dup {
			return nil, at("key %q is given twice (first on line %d)", key, cf.lines[key])
		}
		if v.Kind != yaml.ScalarNode {
			return nil, at("%s must be a single value, got a %s", key, kindName(v))
		}
		if v.Tag == "!!null" {
			continue // "key:" with nothing: as if absent
		}
		if err := checkValue(f, v.Value); err != nil {
			return nil, usagef("config file %s line %d: %s: %q is not valid: %v", path, v.Line, key, display(f, v.Value), err)
		}
		cf.values[key] = v.Value
		cf.lines[key] = k.Line
	}
	return cf, nil
}

func kindName(n *yaml.Node) string {
	switch n.Kind {
	case yaml.SequenceNode:
		return "list"
	case yaml.MappingNode:
		return "mapping"
	}
	return "value"
}

// suggest names the known key closest to a mistyped one.
func suggest(key string, known map[string]*pflag.Flag) string {
	best, bestD := "", 3
	for k := range known {
		if d := distance(key, k); d < bestD || d == bestD && best != "" && k < best {
			best, bestD = k, d
		}
	}
	if best == "" {
		return ""
	}
	return fmt.Sprintf("; did you mean %q?", best)
}

// distance is the edit distance of a and b, counting a swap of two
// neighbouring letters as one edit (optimal string alignment).
func distance(a, b string) int {
	d := make([][]int, len(a)+1)
	for i := range d {
		d[i] = make([]int, len(b)+1)
		d[i][0] = i
	}
	for j := range d[0] {
		d[0][j] = j
	}
	for i := 1; i <= len(a); i++ {
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			d[i][j] = min(d[i-1][j]+1, d[i][j-1]+1, d[i-1][j-1]+cost)
			if i > 1 && j > 1 && a[i-1] == b[j-2] && a[i-2] == b[j-1] {
				d[i][j] = min(d[i][j], d[i-2][j-2]+1)
			}
		}
	}
	return d[len(a)][len(b)]
}

// checkValue reports whether v is a valid value of f's type, without
// setting it.
func checkValue(f *pflag.Flag, v string) error {
	var err error
	switch f.Value.Type() {
	case "int":
		_, err = strconv.Atoi(v)
		if err != nil {
			err = errors.New("want an integer")
		}
	case "bool":
		_, err = strconv.ParseBool(v)
		if err != nil {
			err = errors.New("want true or false")
		}
	case "duration":
		_, err = time.ParseDuration(v)
		if err != nil {
			err = errors.New("want a duration such as 10s or 1m30s")
		}
	case "float64":
		_, err = strconv.ParseFloat(v, 64)
		if err != nil {
			err = errors.New("want a number")
		}
	}
	return err
}

// knownFlags returns every flag of every command under root, by name.
func knownFlags(root *cobra.Command) map[string]*pflag.Flag {
	known := map[string]*pflag.Flag{}
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		for _, fs := range []*pflag.FlagSet{c.LocalNonPersistentFlags(), c.PersistentFlags()} {
			fs.VisitAll(func(f *pflag.Flag) {
				if _, ok := known[f.Name]; !ok {
					known[f.Name] = f
				}
			})
		}
		for _, sub := range c.Commands() {
			walk(sub)
		}
	}
	walk(root)
	return known
}

// loadConfig sets every flag of cmd not given on the command line from its
// environment variable or the configuration file, in that order of
// precedence, and records where each value came from.
func (a *app) loadConfig(cmd *cobra.Command) error {
	fs := cmd.Flags()
	path := a.configPath
	if !fs.Changed(configFlag) {
		if v, ok := a.env.LookupEnv(envName(configFlag)); ok && v != "" {
			path = v
		}
	}
	var cf *configFile
	if path != "" {
		var err error
		if cf, err = readConfigFile(path, knownFlags(cmd.Root())); err != nil {
			return err
		}
	}

	a.origins = map[string]origin{}
	file, env := map[string]any{}, map[string]any{}
	fs.VisitAll(func(f *pflag.Flag) {
		if notConfigurable[f.Name] {
			return
		}
		if cf != nil {
			if v, ok := cf.values[f.Name]; ok {
				file[f.Name] = v
				a.origins[f.Name] = origin{kind: "file", line: cf.lines[f.Name]}
			}
		}
		name := envName(f.Name)
		if v, ok := a.env.LookupEnv(name); ok && v != "" {
			env[f.Name] = v
			a.origins[f.Name] = origin{kind: "env", env: name}
		}
		if f.Changed {
			a.origins[f.Name] = origin{kind: "flag"}
		}
	})

	// Merge: the file, then the environment over it, then the flags given
	// on the command line over both (posflag adds a flag's default only
	// where no lower layer has a value).
	k := koanf.New("\x00") // flag names hold '.'-free words: no nesting
	for _, layer := range []map[string]any{file, env} {
		if err := k.Load(confmap.Provider(layer, ""), nil); err != nil {
			return err
		}
	}
	if err := k.Load(posflag.Provider(fs, "", k), nil); err != nil {
		return err
	}

	var err error
	fs.VisitAll(func(f *pflag.Flag) {
		o := a.origins[f.Name]
		if err != nil || f.Changed || (o.kind != "env" && o.kind != "file") {
			return
		}
		v := k.String(f.Name)
		if serr := fs.Set(f.Name, v); serr != nil {
			switch o.kind {
			case "env":
				err = usagef("%s=%q is not a valid value for --%s: %v", o.env, display(f, v), f.Name, serr)
			default:
				err = usagef("config file %s line %d: %s: %q is not valid: %v", cf.path, o.line, f.Name, display(f, v), serr)
			}
		}
	})
	if err != nil {
		return err
	}
	if cf != nil {
		a.configFile = cf.path
	}
	return nil
}

// printConfig prints every setting of cmd with its value (secrets hidden)
// and where it came from.
func (a *app) printConfig(cmd *cobra.Command) error {
	w := tabwriter.NewWriter(a.env.Stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintf(w, "# outbox %s: effective configuration", strings.TrimPrefix(cmd.CommandPath(), "outbox "))
	if a.configFile != "" {
		fmt.Fprintf(w, " (config file %s)", a.configFile)
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "KEY\tVALUE\tSOURCE")
	var names []string
	cmd.Flags().VisitAll(func(f *pflag.Flag) {
		if !notConfigurable[f.Name] {
			names = append(names, f.Name)
		}
	})
	slices.Sort(names)
	for _, n := range names {
		f := cmd.Flags().Lookup(n)
		o := a.origins[n]
		if o.kind == "" {
			o.kind = "default"
		}
		v, src := display(f, f.Value.String()), o.String()
		if iv, why, ok := impliedSetting(cmd, n); ok {
			v, src = iv, why
		}
		if v == "" {
			v = `""`
		}
		fmt.Fprintf(w, "%s\t%s\t%s\n", n, v, src)
	}
	return w.Flush()
}

// flagRef names a flag in a message, with where its value came from.
func (a *app) flagRef(name string) string {
	switch o := a.origins[name]; o.kind {
	case "env":
		return "--" + name + " (from " + o.env + ")"
	case "file":
		return fmt.Sprintf("--%s (from %s line %d)", name, a.configFile, o.line)
	}
	return "--" + name
}
