package testenv_test

import (
	"strings"
	"testing"

	"github.com/chromedp/chromedp"

	"github.com/outboxrelay/outbox/internal/testenv"
)

func TestBrowser(t *testing.T) {
	t.Parallel()
	ctx := testenv.Browser(t)
	if err := chromedp.Do(ctx, chromedp.Navigate("data:text/html,<title>hello</title>")); err != nil {
		t.Fatal(err)
	}
	got, err := chromedp.Run(ctx, chromedp.Title())
	if err != nil || got != "hello" {
		t.Fatalf("title = %q, %v; want hello", got, err)
	}
}

// TestFindChromiumMissing: without Chromium the error says how to install
// it (Browser fails the test with it).
func TestFindChromiumMissing(t *testing.T) {
	t.Setenv("PATH", t.TempDir())
	_, err := testenv.FindChromium()
	if err == nil || !strings.Contains(err.Error(), "apt-get install chromium") {
		t.Fatalf("FindChromium without chromium on PATH = %v, want an error with the install command", err)
	}
}
