// Package buildinfo tells which build of the outbox command is running: the
// module version, the VCS commit and the Go version, read from
// runtime/debug.ReadBuildInfo (which the go command fills in at build time;
// no -ldflags needed).
package buildinfo

import (
	"runtime"
	"runtime/debug"
)

// These may be set with -ldflags "-X …" by a build that has no VCS
// checkout (a container build whose context leaves .git out, a git
// worktree, which the go command does not stamp): they fill in what
// ReadBuildInfo lacks and never override it.
var (
	version  string // -X github.com/outboxrelay/outbox/internal/buildinfo.version=v1.2.3
	revision string // -X github.com/outboxrelay/outbox/internal/buildinfo.revision=$(git rev-parse HEAD)
)

// Info describes a build.
type Info struct {
	// Version is the main module's version: a tag such as v1.2.0 when built
	// with `go install module@version`, a pseudo-version with the commit
	// when built from a checkout of a tagged repository, or "(devel)".
	Version string `json:"version"`
	// Revision is the VCS commit (vcs.revision), "" when not built from a
	// checkout.
	Revision string `json:"revision,omitempty"`
	// Time is the commit's time (vcs.time), RFC 3339.
	Time string `json:"time,omitempty"`
	// Modified reports a checkout with uncommitted changes (vcs.modified).
	Modified bool `json:"modified,omitempty"`
	// GoVersion is the Go toolchain that built the binary.
	GoVersion string `json:"go_version"`
	// Platform is GOOS/GOARCH.
	Platform string `json:"platform"`
	// Tags are the build tags (-tags), "" when none.
	Tags string `json:"tags,omitempty"`
}

// Read returns the running binary's build information.
func Read() Info {
	info := Info{Version: "(unknown)", GoVersion: runtime.Version(), Platform: runtime.GOOS + "/" + runtime.GOARCH}
	if bi, ok := debug.ReadBuildInfo(); ok {
		info = fromBuildInfo(bi, info)
	}
	return withLinkerValues(info, version, revision)
}

// withLinkerValues fills the version and revision a build left unknown with
// the values set at link time.
func withLinkerValues(info Info, version, revision string) Info {
	if version != "" && (info.Version == "(devel)" || info.Version == "(unknown)") {
		info.Version = version
	}
	if revision != "" && info.Revision == "" {
		info.Revision = revision
	}
	return info
}

func fromBuildInfo(bi *debug.BuildInfo, info Info) Info {
	if bi.Main.Version != "" {
		info.Version = bi.Main.Version
	}
	if bi.GoVersion != "" {
		info.GoVersion = bi.GoVersion
	}
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			info.Revision = s.Value
		case "vcs.time":
			info.Time = s.Value
		case "vcs.modified":
			info.Modified = s.Value == "true"
		case "-tags":
			info.Tags = s.Value
		}
	}
	return info
}

// ShortRevision is the first 12 characters of Revision, with "-dirty" for a
// modified checkout.
func (i Info) ShortRevision() string {
	r := i.Revision
	if len(r) > 12 {
		r = r[:12]
	}
	if r != "" && i.Modified {
		r += "-dirty"
	}
	return r
}

// String is one line: "outbox v1.2.0 (commit 0123456789ab, 2026-01-02T…,
// go1.26.8 linux/amd64)".
func (i Info) String() string {
	s := "outbox " + i.Version + " ("
	if r := i.ShortRevision(); r != "" {
		s += "commit " + r + ", "
		if i.Time != "" {
			s += i.Time + ", "
		}
	}
	s += i.GoVersion + " " + i.Platform
	if i.Tags != "" {
		s += ", tags " + i.Tags
	}
	return s + ")"
}

// Labels are the labels of the outbox_build_info gauge.
func (i Info) Labels() map[string]string {
	return map[string]string{
		"version":   i.Version,
		"revision":  i.ShortRevision(),
		"goversion": i.GoVersion,
	}
}
