package postgres

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgtype"

	"github.com/outboxrelay/outbox"
)

// Sampling of the xmin horizon by the relay (see [Store.XminHorizon]).
const (
	// HorizonSampleInterval: Heartbeat reads the horizon at most this
	// often (one more statement beside the heartbeat's).
	HorizonSampleInterval = 30 * time.Second
	// HorizonWarnAfterDefault is the default of Options.HorizonWarnAfter.
	HorizonWarnAfterDefault = time.Minute
	// HorizonWarnEvery: while the same holder keeps the horizon past
	// HorizonWarnAfter, the WARN is repeated at most this often.
	HorizonWarnEvery = 5 * time.Minute
	// horizonHolders bounds the holders listed (besides the oldest of each
	// kind, always listed).
	horizonHolders = 5
)

// horizonSQL lists who holds the xmin horizon back for the outbox table:
// the sessions of this database (and WAL senders, which carry a standby's
// hot_standby_feedback; sessions of other databases do not hold back this
// database's tables), its prepared transactions, and every replication
// slot's xmin and catalog_xmin (cluster-wide). Kept: the oldest holders
// ($1 of them) and the oldest of each kind. Readable by any user; a
// session's state, times and client need pg_read_all_stats (pg_monitor) to
// be seen for other users' sessions.
//
// A session's age in seconds: since its transaction started when it holds
// a transaction ID, or when it is not running a statement (its snapshot is
// then the transaction's in REPEATABLE READ; an idle READ COMMITTED
// transaction without an ID holds nothing and is not listed); since its
// statement started otherwise.
const horizonSQL = `WITH h AS (
    SELECT 'session' AS kind, a.pid, NULL::text AS name, a.datname::text AS db, a.usename::text AS usr,
        a.application_name AS app, a.state, host(a.client_addr) AS client, a.xact_start, a.query_start,
        greatest(age(a.backend_xid), age(a.backend_xmin))::bigint AS xids,
        extract(epoch FROM now() - CASE WHEN a.backend_xid IS NULL AND a.state = 'active' THEN a.query_start ELSE a.xact_start END)::float8 AS secs,
        NULL::text AS xmin
    FROM pg_stat_activity a
    WHERE (a.backend_xid IS NOT NULL OR a.backend_xmin IS NOT NULL)
      AND (a.datname = current_database() OR a.datname IS NULL)
      AND a.pid <> pg_backend_pid()
    UNION ALL
    SELECT 'prepared', 0, p.gid, p.database::text, p.owner::text, NULL, NULL, NULL, p.prepared, NULL,
        age(p.transaction)::bigint, extract(epoch FROM now() - p.prepared)::float8, NULL
    FROM pg_prepared_xacts p
    WHERE p.database = current_database()
    UNION ALL
    SELECT 'slot', coalesce(r.active_pid, 0), r.slot_name::text, r.database::text, NULL, NULL,
        CASE WHEN r.active THEN 'active' ELSE 'inactive' END, NULL, NULL, NULL, age(r.xmin)::bigint, NULL, r.xmin::text
    FROM pg_replication_slots r
    WHERE r.xmin IS NOT NULL
    UNION ALL
    SELECT 'slot_catalog', coalesce(r.active_pid, 0), r.slot_name::text, r.database::text, NULL, NULL,
        CASE WHEN r.active THEN 'active' ELSE 'inactive' END, NULL, NULL, NULL, age(r.catalog_xmin)::bigint, NULL, r.catalog_xmin::text
    FROM pg_replication_slots r
    WHERE r.catalog_xmin IS NOT NULL
), ranked AS (
    SELECT h.*, row_number() OVER (ORDER BY xids DESC, kind = 'slot_catalog', pid) AS n_all,
        row_number() OVER (PARTITION BY kind ORDER BY xids DESC, pid) AS n_kind
    FROM h
)
SELECT kind, pid, coalesce(name, ''), coalesce(db, ''), coalesce(usr, ''), coalesce(app, ''), coalesce(state, ''),
    coalesce(client, ''), xact_start, query_start, coalesce(xids, 0), secs, coalesce(xmin, ''), now()
FROM ranked
WHERE n_all <= $1 OR n_kind = 1
ORDER BY n_all`

// horizonState is the store's memory of the horizon: when a slot's xmin
// was first seen at its current value (PostgreSQL keeps no time for it),
// and the sampling and warnings of Heartbeat.
type horizonState struct {
	mu        sync.Mutex
	log       *slog.Logger
	slotSeen  map[string]slotXmin // by kind + "/" + slot name
	sampledAt time.Time           // last sample by Heartbeat
	warned    string              // the holder last warned about; "" if none
	warnedAt  time.Time
}

type slotXmin struct {
	xmin string
	seen time.Time
}

// SetLogger makes the store log what the relay should know about the
// database: a WARN when the xmin horizon is held (see [Store.XminHorizon]).
// Call it before the relay starts. Default: nothing is logged.
func (s *Store) SetLogger(l *slog.Logger) {
	s.horizon.mu.Lock()
	s.horizon.log = l
	s.horizon.mu.Unlock()
}

// XminHorizon reads who holds back the database's xmin horizon: the
// oldest sessions (with their pid, user, application, state, transaction
// and statement start), prepared transactions and replication slots
// (xmin, and catalog_xmin, which holds back only the system catalogs). While
// it is held, vacuum cannot remove the rows the relay deletes, and every
// fetch, settle and lease statement walks over them: a forgotten "idle in
// transaction" session makes the relay slower with every message written
// after it began. One statement on pg_stat_activity, pg_prepared_xacts and
// pg_replication_slots, readable by any user; to see other users'
// sessions' state and times, grant the relay's user pg_monitor.
func (s *Store) XminHorizon(ctx context.Context) (*outbox.XminHorizon, error) {
	if err := s.check("xmin horizon"); err != nil {
		return nil, err
	}
	rows, err := s.pool.Query(ctx, horizonSQL, horizonHolders)
	if err != nil {
		return nil, s.wrap("xmin horizon", err)
	}
	type row struct {
		h    outbox.HorizonHolder
		xmin string
	}
	var (
		list []row
		at   time.Time
	)
	for rows.Next() {
		var (
			r          row
			xact, qs   pgtype.Timestamptz
			secs       pgtype.Float8
			pid        int32
			clientAddr string
		)
		if err := rows.Scan(&r.h.Kind, &pid, &r.h.Name, &r.h.Database, &r.h.User, &r.h.Application, &r.h.State,
			&clientAddr, &xact, &qs, &r.h.AgeXids, &secs, &r.xmin, &at); err != nil {
			rows.Close()
			return nil, s.wrap("xmin horizon", err)
		}
		r.h.PID, r.h.Client = int(pid), clientAddr
		if xact.Valid {
			r.h.XactStart = xact.Time
		}
		if qs.Valid {
			r.h.QueryStart = qs.Time
		}
		if secs.Valid {
			v := max(0, secs.Float64)
			r.h.AgeSeconds = &v
		}
		list = append(list, r)
	}
	if err := rows.Err(); err != nil {
		return nil, s.wrap("xmin horizon", err)
	}
	hz := &outbox.XminHorizon{At: at, Holders: make([]outbox.HorizonHolder, 0, len(list))}

	// Slots: seconds since their xmin was first seen at this value.
	s.horizon.mu.Lock()
	seen := map[string]slotXmin{}
	for i := range list {
		r := &list[i]
		if r.h.Kind != outbox.HolderSlot && r.h.Kind != outbox.HolderSlotCatalog {
			continue
		}
		k := r.h.Kind + "/" + r.h.Name
		prev, ok := s.horizon.slotSeen[k]
		if !ok || prev.xmin != r.xmin {
			prev = slotXmin{xmin: r.xmin, seen: at}
		}
		seen[k] = prev
		v := max(0, at.Sub(prev.seen).Seconds())
		r.h.AgeSeconds = &v
	}
	s.horizon.slotSeen = seen // slots gone, or no longer among the oldest, are forgotten
	s.horizon.mu.Unlock()

	for _, r := range list {
		hz.Holders = append(hz.Holders, r.h)
		if r.h.Kind != outbox.HolderSlotCatalog && r.h.AgeXids > hz.AgeXids {
			hz.AgeXids = r.h.AgeXids
			hz.AgeSeconds = r.h.AgeSeconds
		}
	}
	return hz, nil
}

// sampleHorizon reads the horizon when the last sample is older than
// HorizonSampleInterval and logs a WARN naming the holder when it has been
// held longer than Options.HorizonWarnAfter (again at most every
// HorizonWarnEvery for the same holder, at once for another), and an INFO
// when it is released. Heartbeat calls it; its failures are logged, never
// returned (the heartbeat succeeded).
func (s *Store) sampleHorizon(ctx context.Context) {
	warnAfter := s.opts.HorizonWarnAfter
	s.horizon.mu.Lock()
	log := s.horizon.log
	due := warnAfter > 0 && log != nil && time.Since(s.horizon.sampledAt) >= HorizonSampleInterval
	if due {
		s.horizon.sampledAt = time.Now()
	}
	s.horizon.mu.Unlock()
	if !due {
		return
	}
	hz, err := s.XminHorizon(ctx)
	if err != nil {
		log.Warn("postgres: cannot read the xmin horizon", "err", err)
		return
	}
	holder, held := hz.Held(warnAfter)
	now := time.Now()
	s.horizon.mu.Lock()
	defer s.horizon.mu.Unlock()
	if !held {
		if s.horizon.warned != "" {
			log.Info("postgres: the xmin horizon is no longer held back; vacuum can remove the outbox's deleted rows again",
				"age_xids", hz.AgeXids)
			s.horizon.warned = ""
		}
		return
	}
	id := holderID(holder)
	if id == s.horizon.warned && now.Sub(s.horizon.warnedAt) < HorizonWarnEvery {
		return
	}
	s.horizon.warned, s.horizon.warnedAt = id, now
	log.Warn("postgres: "+holder.String()+" holds back the xmin horizon: vacuum cannot remove the rows the relay deletes, and every fetch walks over them; the relay slows down with every message written meanwhile. "+HolderAdvice(holder),
		holderAttrs(holder, hz)...)
}

func holderID(h outbox.HorizonHolder) string {
	return fmt.Sprintf("%s/%d/%s/%s", h.Kind, h.PID, h.Name, h.XactStart.Format(time.RFC3339Nano))
}

func holderAttrs(h outbox.HorizonHolder, hz *outbox.XminHorizon) []any {
	a := []any{"holder", h.Kind, "age_xids", h.AgeXids}
	if h.AgeSeconds != nil {
		a = append(a, "age", time.Duration(*h.AgeSeconds*float64(time.Second)).Round(time.Second).String())
	}
	if h.PID != 0 {
		a = append(a, "pid", h.PID)
	}
	for _, kv := range [][2]string{{"name", h.Name}, {"database", h.Database}, {"user", h.User}, {"application", h.Application}, {"state", h.State}, {"client", h.Client}} {
		if kv[1] != "" {
			a = append(a, kv[0], kv[1])
		}
	}
	if !h.XactStart.IsZero() {
		a = append(a, "xact_start", h.XactStart.UTC().Format(time.RFC3339))
	}
	if !h.QueryStart.IsZero() {
		a = append(a, "query_start", h.QueryStart.UTC().Format(time.RFC3339))
	}
	return a
}

// HolderAdvice says how to release a holder.
func HolderAdvice(h outbox.HorizonHolder) string {
	switch h.Kind {
	case outbox.HolderSession:
		return fmt.Sprintf("End its transaction (commit it, or SELECT pg_terminate_backend(%d)); set idle_in_transaction_session_timeout to prevent it.", h.PID)
	case outbox.HolderPrepared:
		return fmt.Sprintf("COMMIT PREPARED or ROLLBACK PREPARED '%s'.", strings.ReplaceAll(h.Name, "'", "''"))
	case outbox.HolderSlot:
		return "A standby with hot_standby_feedback, or an unused slot: drop the slot if it is unused (pg_drop_replication_slot), or end the standby's long queries."
	}
	return "A logical slot's consumer is behind; this holds back only the system catalogs."
}
