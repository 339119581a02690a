package testenv

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/chromedp/chromedp"
)

// chromiumNames are the executables Browser looks for, in order.
var chromiumNames = []string{"chromium", "chromium-browser", "google-chrome", "google-chrome-stable"}

// ChromiumInstall is the command that installs the browser of the tests.
const ChromiumInstall = "apt-get install chromium (Debian's package; scripts/test.sh installs it when missing)"

// Browser starts a headless Chromium for this test, with a fresh profile
// in a temporary directory, and returns a chromedp context of one tab in
// it. The browser is closed by t.Cleanup. Without Chromium installed the
// test fails with the install command.
//
// The browser is started with the flags this machine's closed network
// needs: no background networking, component updates, sync or QUIC.
func Browser(t testing.TB) context.Context {
	t.Helper()
	path, err := FindChromium()
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	profile := t.TempDir()
	opts := []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(path),
		chromedp.UserDataDir(profile),
		chromedp.Headless,
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.NoFirstRun,
		chromedp.NoDefaultBrowserCheck,
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("disable-extensions", true),
		chromedp.Flag("disable-default-apps", true),
		chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.Flag("no-proxy-server", true),
		chromedp.WindowSize(1280, 900),
		chromedp.CombinedOutput(browserLog(t, profile)),
	}
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancel := chromedp.NewContext(actx)
	t.Cleanup(func() {
		cancel()
		cancelAlloc()
	})
	if err := chromedp.Do(ctx); err != nil {
		t.Fatalf("testenv: start %s: %v (see %s)", path, err, filepath.Join(profile, "chromium.log"))
	}
	return ctx
}

// FindChromium returns the path of the Chromium on PATH, or an error that
// says how to install it.
func FindChromium() (string, error) {
	for _, name := range chromiumNames {
		if p, err := exec.LookPath(name); err == nil {
			return p, nil
		}
	}
	return "", fmt.Errorf("the console's browser tests need a headless Chromium, which is not installed (looked for %v on PATH): %s", chromiumNames, ChromiumInstall)
}

// browserLog returns the file that receives the browser's output.
func browserLog(t testing.TB, dir string) *os.File {
	f, err := os.Create(filepath.Join(dir, "chromium.log"))
	if err != nil {
		t.Fatalf("testenv: browser log: %v", err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}
