package cli

import (
	"bytes"
	"regexp"
	"testing"
	"time"

	"github.com/outboxrelay/outbox"
)

// A horizon held past a minute is called HELD, names its holder, and lists
// the holders; a young one is free.
func TestWriteHorizonText(t *testing.T) {
	start := time.Date(2026, 11, 27, 8, 0, 0, 0, time.UTC)
	hz := &outbox.XminHorizon{AgeXids: 181111, AgeSeconds: new(754.0), Holders: []outbox.HorizonHolder{
		{Kind: outbox.HolderSession, PID: 4242, User: "app", Application: "psql", State: "idle in transaction", XactStart: start, QueryStart: start, AgeXids: 181111, AgeSeconds: new(754.0)},
		{Kind: outbox.HolderSlotCatalog, Name: "debezium", State: "active", PID: 99, AgeXids: 12, AgeSeconds: new(3.0)},
	}}
	var b bytes.Buffer
	if err := writeHorizonText(&b, hz); err != nil {
		t.Fatal(err)
	}
	for _, re := range []string{
		`(?m)^xmin horizon\s+HELD for 12m34s \(181111 xids\) by session pid 4242 \(user app, application psql, idle in transaction\): vacuum cannot remove`,
		`(?m)^HORIZON HOLDER\s+PID\s+AGE\s+XIDS\s+STATE\s+TRANSACTION START\s+STATEMENT START$`,
		`(?m)^session pid 4242 .*\s+4242\s+12m34s\s+181111\s+idle in transaction\s+2026-11-27T08:00:00Z\s+2026-11-27T08:00:00Z$`,
		`(?m)^replication slot "debezium" \(catalog_xmin\) \[catalogs only\]\s+99\s+3s\s+12\s+active\s+-\s+-$`,
	} {
		if !regexp.MustCompile(re).MatchString(b.String()) {
			t.Errorf("horizon text does not match %s:\n%s", re, b.String())
		}
	}

	b.Reset()
	hz = &outbox.XminHorizon{AgeXids: 3, AgeSeconds: new(0.25), Holders: []outbox.HorizonHolder{{Kind: outbox.HolderSession, PID: 1, AgeXids: 3, AgeSeconds: new(0.25)}}}
	if err := writeHorizonText(&b, hz); err != nil {
		t.Fatal(err)
	}
	if want := "\nxmin horizon  free (oldest transaction 250ms, 3 xids)\n"; b.String() != want {
		t.Errorf("free horizon text %q, want %q", b.String(), want)
	}
}
