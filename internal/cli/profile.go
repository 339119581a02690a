//go:build !outbox_slim

package cli

import (
	"fmt"
	"os"
	"runtime/pprof"
)

// startCPUProfile profiles the process's CPU into the file named by the
// --cpuprofile flag's value, path, and returns what stops the profile and
// closes the file. An empty path profiles nothing.
func (a *app) startCPUProfile(path string) (stop func(), err error) {
	if path == "" {
		return func() {}, nil
	}
	f, err := os.Create(path)
	if err != nil {
		return nil, usagef("%s: %v", a.flagRef("cpuprofile"), err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, fmt.Errorf("start the CPU profile: %w", err)
	}
	return func() {
		pprof.StopCPUProfile()
		f.Close()
	}, nil
}
