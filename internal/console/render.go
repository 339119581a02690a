package console

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"html/template"
	"strings"
	"time"
)

// pageNames are the page templates; each is parsed with layout.html.
var pageNames = []string{"overview", "partitions", "deadletters", "deadletter", "confirm", "find", "message", "signin", "error"}

var funcs = template.FuncMap{
	"num": func(n int64) string { return groupThousands(n) },
	"ts": func(t time.Time) string {
		if t.IsZero() {
			return "–"
		}
		return t.UTC().Format("2006-01-02 15:04:05.000 UTC")
	},
	"plural": func(n int64, one, many string) string {
		if n == 1 {
			return one
		}
		return many
	},
}

func parsePages() (map[string]*template.Template, error) {
	pages := map[string]*template.Template{}
	for _, name := range pageNames {
		t, err := template.New(name).Funcs(funcs).ParseFS(templateFiles, "templates/layout.html", "templates/"+name+".html")
		if err != nil {
			return nil, err
		}
		pages[name] = t
	}
	return pages, nil
}

// age formats a duration for a person: 850ms, 12.3s, 4m05s, 3h12m, 2d4h.
func age(d time.Duration) string {
	switch {
	case d < 0:
		return "0s"
	case d < time.Second:
		return d.Round(time.Millisecond).String()
	case d < time.Minute:
		return d.Round(100 * time.Millisecond).String()
	case d < time.Hour:
		d = d.Round(time.Second)
		return strings.TrimSuffix(d.String(), "0s")
	case d < 48*time.Hour:
		d = d.Round(time.Minute)
		return strings.TrimSuffix(strings.TrimSuffix(d.String(), "0s"), "0m")
	default:
		days := d / (24 * time.Hour)
		hours := (d - days*24*time.Hour) / time.Hour
		return itoa(int64(days)) + "d" + itoa(int64(hours)) + "h"
	}
}

func itoa(n int64) string { return groupThousands(n) }

// payloadView is a payload as the dead-letter page shows it.
type payloadView struct {
	Kind      string // "JSON", "hex" or "empty"
	Text      string
	Size      int
	Truncated bool
}

// Bounds of a rendered payload.
const (
	payloadJSONMax = 256 << 10
	payloadHexMax  = 16 << 10
)

// renderPayload pretty-prints JSON and dumps anything else in hex (with
// the printable bytes beside). The template escapes the text.
func renderPayload(p []byte) payloadView {
	v := payloadView{Size: len(p)}
	switch {
	case len(p) == 0:
		v.Kind = "empty"
	case len(p) <= payloadJSONMax && json.Valid(p):
		var b bytes.Buffer
		if err := json.Indent(&b, p, "", "  "); err == nil {
			v.Kind, v.Text = "JSON", b.String()
			break
		}
		fallthrough
	default:
		v.Kind = "hex"
		if len(p) > payloadHexMax {
			p, v.Truncated = p[:payloadHexMax], true
		}
		v.Text = hex.Dump(p)
	}
	return v
}
