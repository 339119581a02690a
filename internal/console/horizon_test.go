package console_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/outboxrelay/outbox"
	"github.com/outboxrelay/outbox/internal/console"
	"github.com/outboxrelay/outbox/store/sqlite"
)

// horizonStatus reports a given xmin horizon with its status, as the
// PostgreSQL store does.
type horizonStatus struct {
	*sqlite.Store
	hz *outbox.XminHorizon
}

func (h *horizonStatus) Status(ctx context.Context) (*outbox.Status, error) {
	st, err := h.Store.Status(ctx)
	if st != nil {
		st.XminHorizon = h.hz
	}
	return st, err
}

// The overview names the session holding the xmin horizon, in the page
// and its JSON; a free horizon is one quiet line.
func TestOverviewShowsXminHorizon(t *testing.T) {
	t.Parallel()
	held := &outbox.XminHorizon{AgeXids: 90000, AgeSeconds: new(600.0), Holders: []outbox.HorizonHolder{
		{Kind: outbox.HolderSession, PID: 4242, Application: "psql", State: "idle in transaction", AgeXids: 90000, AgeSeconds: new(600.0)},
	}}
	h := handler(t, console.Options{Store: &horizonStatus{Store: liteStore(t), hz: held}})
	_, body := get(t, h, "/")
	if !strings.Contains(body, `id="xmin-horizon"`) || !strings.Contains(body, "held for 10m (90000 transaction IDs) by session pid 4242 (application psql, idle in transaction)") {
		t.Errorf("overview does not name the holder:\n%s", body)
	}
	_, body = get(t, h, "/api/overview")
	var out struct {
		XminHorizon struct {
			Held   bool `json:"held"`
			Holder struct {
				PID int `json:"pid"`
			} `json:"holder"`
		} `json:"xmin_horizon"`
	}
	if err := json.Unmarshal([]byte(body), &out); err != nil {
		t.Fatal(err)
	}
	if !out.XminHorizon.Held || out.XminHorizon.Holder.PID != 4242 {
		t.Errorf("overview JSON xmin_horizon: %s", body)
	}

	free := &outbox.XminHorizon{AgeXids: 2, AgeSeconds: new(0.5), Holders: []outbox.HorizonHolder{{Kind: outbox.HolderSession, PID: 1, AgeXids: 2, AgeSeconds: new(0.5)}}}
	h = handler(t, console.Options{Store: &horizonStatus{Store: liteStore(t), hz: free}})
	if _, body := get(t, h, "/"); !strings.Contains(body, "xmin horizon free: the oldest transaction is") || strings.Contains(body, "held for") {
		t.Errorf("free horizon:\n%s", body)
	}
	// A store without a horizon (SQLite) shows no line.
	h = handler(t, console.Options{Store: liteStore(t)})
	if _, body := get(t, h, "/"); strings.Contains(body, "xmin-horizon") {
		t.Errorf("a store without a horizon shows one:\n%s", body)
	}
}
