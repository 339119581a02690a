package outbox

import (
	"context"
	"fmt"
	"strings"
	"time"
)

// Kinds of [HorizonHolder].
const (
	// HolderSession: a session (a backend, or a WAL sender relaying a
	// standby's hot_standby_feedback) whose transaction ID or snapshot
	// (backend_xid, backend_xmin) is the oldest.
	HolderSession = "session"
	// HolderPrepared: a prepared transaction (PREPARE TRANSACTION) not yet
	// committed or rolled back.
	HolderPrepared = "prepared"
	// HolderSlot: a replication slot's xmin (a physical slot of a standby
	// with hot_standby_feedback). It holds back every table.
	HolderSlot = "slot"
	// HolderSlotCatalog: a replication slot's catalog_xmin (a logical
	// slot). It holds back only the system catalogs, not the outbox table.
	HolderSlotCatalog = "slot_catalog"
)

// HorizonKinds lists the kinds of [HorizonHolder], for metrics that export
// one series per kind.
var HorizonKinds = []string{HolderSession, HolderPrepared, HolderSlot, HolderSlotCatalog}

// XminHorizon describes what keeps a database's vacuum from removing
// deleted rows: the oldest transaction IDs and snapshots still in use. A
// store that deletes a row per message (PostgreSQL with capture table)
// piles up dead rows while it is held, and its statements walk them.
type XminHorizon struct {
	// AgeXids is the age, in transaction IDs, of the oldest holder that
	// holds back the outbox table (every kind but HolderSlotCatalog).
	AgeXids int64 `json:"age_xids"`
	// AgeSeconds is how long that holder has held it, when known (a
	// session's transaction start, a prepared transaction's PREPARE time;
	// for a slot, since the relay first saw its xmin at that value).
	AgeSeconds *float64 `json:"age_seconds,omitempty"`
	// Holders are the oldest holders, oldest first (at most a handful;
	// catalog-only holders included, after the others of equal age).
	Holders []HorizonHolder `json:"holders"`
	// At is when the database was read (its clock).
	At time.Time `json:"at"`
}

// HorizonHolder is one session, prepared transaction or replication slot
// holding back the xmin horizon.
type HorizonHolder struct {
	// Kind is one of HolderSession, HolderPrepared, HolderSlot,
	// HolderSlotCatalog.
	Kind string `json:"kind"`
	// PID is the server process of a session (or of the WAL sender of an
	// active slot); 0 when none.
	PID int `json:"pid,omitempty"`
	// Name is a slot's name or a prepared transaction's GID.
	Name string `json:"name,omitempty"`
	// Database, User, Application (application_name) and State (active,
	// idle in transaction, …) describe a session; State and the times are
	// empty when the relay's user may not see them (grant it pg_monitor or
	// pg_read_all_stats).
	Database    string `json:"database,omitempty"`
	User        string `json:"user,omitempty"`
	Application string `json:"application,omitempty"`
	State       string `json:"state,omitempty"`
	// Client is the session's client address, when over TCP and visible.
	Client string `json:"client,omitempty"`
	// XactStart and QueryStart are a session's transaction and current (or
	// last) statement start; XactStart is a prepared transaction's PREPARE.
	XactStart  time.Time `json:"xact_start,omitzero"`
	QueryStart time.Time `json:"query_start,omitzero"`
	// AgeXids and AgeSeconds as in [XminHorizon], for this holder.
	AgeXids    int64    `json:"age_xids"`
	AgeSeconds *float64 `json:"age_seconds,omitempty"`
}

// HorizonReader is implemented by stores whose cost depends on the
// database's vacuum (PostgreSQL with capture table); metrics adapters
// export the horizon's age. XminHorizon does one round trip.
type HorizonReader interface {
	XminHorizon(ctx context.Context) (*XminHorizon, error)
}

// Held returns the holder that holds the horizon back for the outbox
// table (the oldest in transaction IDs, not a catalog-only slot) when it
// has held it for at least d and for at least one transaction ID.
func (hz *XminHorizon) Held(d time.Duration) (HorizonHolder, bool) {
	if hz == nil {
		return HorizonHolder{}, false
	}
	for _, h := range hz.Holders {
		if h.Kind == HolderSlotCatalog || h.AgeXids != hz.AgeXids {
			continue
		}
		held := h.AgeXids > 0 && h.AgeSeconds != nil && *h.AgeSeconds >= d.Seconds()
		return h, held
	}
	return HorizonHolder{}, false
}

// String names a holder for a person: "session pid 1234 (user app,
// application psql, idle in transaction)", "prepared transaction \"gid\"",
// "replication slot \"name\" (xmin)".
func (h HorizonHolder) String() string {
	switch h.Kind {
	case HolderSession:
		var parts []string
		for _, kv := range [][2]string{{"user ", h.User}, {"application ", h.Application}, {"", h.State}, {"from ", h.Client}} {
			if kv[1] != "" {
				parts = append(parts, kv[0]+kv[1])
			}
		}
		t := fmt.Sprintf("session pid %d", h.PID)
		if len(parts) > 0 {
			t += " (" + strings.Join(parts, ", ") + ")"
		}
		return t
	case HolderPrepared:
		return fmt.Sprintf("prepared transaction %q", h.Name)
	case HolderSlot:
		return fmt.Sprintf("replication slot %q (xmin)", h.Name)
	case HolderSlotCatalog:
		return fmt.Sprintf("replication slot %q (catalog_xmin)", h.Name)
	}
	return h.Kind
}
