package buildinfo

import (
	"runtime/debug"
	"strings"
	"testing"
)

func TestFromBuildInfo(t *testing.T) {
	bi := &debug.BuildInfo{
		GoVersion: "go1.26.8",
		Main:      debug.Module{Path: "github.com/outboxrelay/outbox", Version: "v1.2.3"},
		Settings: []debug.BuildSetting{
			{Key: "vcs.revision", Value: "0123456789abcdef0123"},
			{Key: "vcs.time", Value: "2026-01-02T03:04:05Z"},
			{Key: "vcs.modified", Value: "true"},
			{Key: "-tags", Value: "outbox_slim"},
		},
	}
	got := fromBuildInfo(bi, Info{Platform: "linux/amd64"})
	want := "outbox v1.2.3 (commit 0123456789ab-dirty, 2026-01-02T03:04:05Z, go1.26.8 linux/amd64, tags outbox_slim)"
	if got.String() != want {
		t.Fatalf("String() = %q; want %q", got.String(), want)
	}
	if l := got.Labels(); l["version"] != "v1.2.3" || l["revision"] != "0123456789ab-dirty" || l["goversion"] != "go1.26.8" {
		t.Fatalf("Labels() = %v", l)
	}
}

func TestReadInTest(t *testing.T) {
	// A test binary has build information: the Go version at least.
	i := Read()
	if !strings.HasPrefix(i.GoVersion, "go") || i.Platform == "" || i.Version == "" {
		t.Fatalf("Read() = %+v", i)
	}
}

func TestLinkerValuesFillOnlyTheGaps(t *testing.T) {
	got := withLinkerValues(Info{Version: "(devel)"}, "v1.0.0", "abc")
	if got.Version != "v1.0.0" || got.Revision != "abc" {
		t.Fatalf("gaps not filled: %+v", got)
	}
	got = withLinkerValues(Info{Version: "v2.0.0", Revision: "def"}, "v1.0.0", "abc")
	if got.Version != "v2.0.0" || got.Revision != "def" {
		t.Fatalf("build info overridden: %+v", got)
	}
}
