package postgres

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/outboxrelay/outbox"
)

// walMinServerVersion is the first PostgreSQL whose pgoutput streams
// logical decoding messages (the messages option).
const walMinServerVersion = 140000

// serverCheck is what the start-up check reads, in one round trip.
type serverCheck struct {
	version      int
	walLevel     string
	maxSlots     int
	usedSlots    int
	maxSenders   int
	usedSenders  int
	canReplicate bool
	user         string
	database     string
	slot         slotRow
}

// slotRow is the slot's row of pg_replication_slots (exists false when
// there is none).
type slotRow struct {
	exists    bool
	plugin    string
	database  string
	active    bool
	activePID int
	walStatus string
	confirmed pglogrepl.LSN
	lagBytes  int64
	safeBytes *int64
}

const serverCheckSQL = `SELECT current_setting('server_version_num')::integer,
    current_setting('wal_level'),
    current_setting('max_replication_slots')::integer,
    (SELECT count(*) FROM pg_replication_slots)::integer,
    current_setting('max_wal_senders')::integer,
    (SELECT count(*) FROM pg_stat_replication)::integer,
    coalesce((SELECT rolreplication OR rolsuper FROM pg_roles WHERE rolname = current_user), false),
    current_user, current_database(),
    s.slot_name IS NOT NULL, coalesce(s.plugin, ''), coalesce(s.database, ''), coalesce(s.active, false),
    coalesce(s.active_pid, 0), coalesce(s.wal_status, ''), coalesce(s.confirmed_flush_lsn, '0/0'::pg_lsn)::text,
    coalesce(pg_current_wal_lsn() - s.confirmed_flush_lsn, 0)::bigint, s.safe_wal_size
FROM (SELECT 1) AS one LEFT JOIN pg_replication_slots s ON s.slot_name = $1`

func (s *WALStore) readServer(ctx context.Context) (serverCheck, error) {
	var c serverCheck
	var confirmed string
	err := s.tab.pool.QueryRow(ctx, serverCheckSQL, s.w.Slot).Scan(
		&c.version, &c.walLevel, &c.maxSlots, &c.usedSlots, &c.maxSenders, &c.usedSenders, &c.canReplicate,
		&c.user, &c.database,
		&c.slot.exists, &c.slot.plugin, &c.slot.database, &c.slot.active, &c.slot.activePID, &c.slot.walStatus, &confirmed,
		&c.slot.lagBytes, &c.slot.safeBytes)
	if err != nil {
		return c, wrapErr("check the server for capture wal", s.opts, err)
	}
	if c.slot.confirmed, err = pglogrepl.ParseLSN(confirmed); err != nil {
		return c, fmt.Errorf("postgres: slot %q: confirmed_flush_lsn %q: %w", s.w.Slot, confirmed, err)
	}
	return c, nil
}

// problem returns what stops a relay from streaming from the slot, with
// what to change, or nil. It does not judge whether the slot is free.
func (s *WALStore) problem(c serverCheck) error {
	slot := s.w.Slot
	switch {
	case c.version < walMinServerVersion:
		return fmt.Errorf("postgres: capture wal needs PostgreSQL 14 or later (logical decoding messages in pgoutput); this server is version %d: upgrade it or use capture table", c.version)
	case c.walLevel != "logical":
		return fmt.Errorf("postgres: capture wal needs wal_level = logical, the server has %q: run ALTER SYSTEM SET wal_level = logical (or set it in postgresql.conf) and restart PostgreSQL", c.walLevel)
	case !c.canReplicate:
		return fmt.Errorf("postgres: capture wal needs the REPLICATION attribute for user %q to stream from slot %q: run ALTER ROLE %s WITH REPLICATION as a superuser",
			c.user, slot, pgx.Identifier{c.user}.Sanitize())
	case c.slot.exists && c.slot.walStatus == "lost":
		return fmt.Errorf("postgres: slot %q (confirmed up to %s): %w. The server removed WAL the slot still needed (max_slot_wal_keep_size was exceeded while no relay read it). Publish what is missing from your own records, then drop the slot (SELECT pg_drop_replication_slot('%s')) and run `outbox migrate --capture wal` to create a new one",
			slot, c.slot.confirmed, ErrSlotLost, slot)
	case c.slot.exists && c.slot.plugin != "pgoutput":
		return fmt.Errorf("postgres: replication slot %q uses plugin %q, capture wal needs pgoutput: drop it or set another slot name (Options.WAL.Slot)", slot, c.slot.plugin)
	case c.slot.exists && c.slot.database != c.database:
		return fmt.Errorf("postgres: replication slot %q belongs to database %q, not %q: set another slot name (Options.WAL.Slot)", slot, c.slot.database, c.database)
	case !c.slot.exists && c.usedSlots >= c.maxSlots:
		return fmt.Errorf("postgres: cannot create replication slot %q: all %d slots (max_replication_slots) are in use: raise max_replication_slots and restart PostgreSQL, or drop an unused slot (see SELECT slot_name, active FROM pg_replication_slots)", slot, c.maxSlots)
	case !c.slot.active && c.usedSenders >= c.maxSenders:
		return fmt.Errorf("postgres: no WAL sender is free for slot %q: all %d (max_wal_senders) are in use: raise max_wal_senders and restart PostgreSQL", slot, c.maxSenders)
	}
	return nil
}

// Check reports what stops a relay from streaming from the slot (the
// server version, wal_level, the REPLICATION attribute, free slots and WAL
// senders, a lost slot), with what to change, or nil.
func (s *WALStore) Check(ctx context.Context) error {
	if err := s.check("check"); err != nil {
		return err
	}
	c, err := s.readServer(ctx)
	if err != nil {
		return err
	}
	return s.problem(c)
}

// Migrate creates or upgrades the outbox tables (for the partition count
// and the dead letters; nothing is written to the messages table in this
// mode), then the publication and the slot, after checking the server. A
// slot sees the transactions that commit after it was created: migrate
// before writers emit into the WAL.
func (s *WALStore) Migrate(ctx context.Context) error {
	if err := s.check("migrate"); err != nil {
		return err
	}
	if err := s.tab.Migrate(ctx); err != nil {
		return err
	}
	p, err := s.tab.Partitions(ctx)
	if err != nil {
		return err
	}
	s.mu.Lock()
	if s.p == 0 {
		s.p = p
	}
	s.mu.Unlock()
	c, err := s.readServer(ctx)
	if err != nil {
		return err
	}
	if err := s.problem(c); err != nil {
		return err
	}
	return s.ensureSlot(ctx, c)
}

// ensureSlot creates the publication and the slot if they are missing.
func (s *WALStore) ensureSlot(ctx context.Context, c serverCheck) error {
	var exists bool
	if err := s.tab.pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_publication WHERE pubname = $1)`, s.w.Publication).Scan(&exists); err != nil {
		return wrapErr("look for the publication", s.opts, err)
	}
	if !exists {
		// No table: the stream carries only the logical messages.
		_, err := s.tab.pool.Exec(ctx, `CREATE PUBLICATION `+pgx.Identifier{s.w.Publication}.Sanitize())
		if err != nil && !isDuplicate(err) {
			return fmt.Errorf("postgres: create publication %q for capture wal (needs the CREATE privilege on the database): %w", s.w.Publication, err)
		}
	}
	if !c.slot.exists {
		_, err := s.tab.pool.Exec(ctx, `SELECT pg_create_logical_replication_slot($1, 'pgoutput')`, s.w.Slot)
		if err != nil && !isDuplicate(err) {
			return fmt.Errorf("postgres: create replication slot %q: %w", s.w.Slot, err)
		}
		if err == nil {
			s.logger().Info("created replication slot", "slot", s.w.Slot, "publication", s.w.Publication)
		}
	}
	return nil
}

// isDuplicate reports a duplicate_object error (created concurrently).
func isDuplicate(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && pe.Code == "42710"
}

func (s *WALStore) logger() *slog.Logger {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.log
}

// SlotStatus describes the slot: whether it exists, is streamed from (by
// this process or another), its WAL status, its lag in bytes and seconds,
// and what stops the relay, if anything.
func (s *WALStore) SlotStatus(ctx context.Context) (*outbox.SlotStatus, error) {
	if err := s.check("slot status"); err != nil {
		return nil, err
	}
	c, err := s.readServer(ctx)
	if err != nil {
		return nil, err
	}
	st := &outbox.SlotStatus{
		Name: s.w.Slot, Exists: c.slot.exists, Active: c.slot.active, ActivePID: c.slot.activePID,
		WALStatus: c.slot.walStatus, ConfirmedLSN: c.slot.confirmed.String(), LagBytes: c.slot.lagBytes,
		SafeWALBytes: c.slot.safeBytes,
	}
	if err := s.tab.pool.QueryRow(ctx, `SELECT count(*) FROM `+s.tab.n.parked).Scan(&st.Parked); err != nil && !missingTables(err) {
		return nil, wrapErr("slot status: count the parked messages", s.opts, err)
	}
	if err := s.problem(c); err != nil {
		st.Error = err.Error()
	} else if !c.slot.exists {
		st.Error = fmt.Sprintf("replication slot %q does not exist: run `outbox migrate --capture wal` (messages written before it exists are not captured)", s.w.Slot)
	}
	s.mu.Lock()
	st.Held = s.active
	if s.active && s.buf != nil {
		lag := 0.0
		if t := s.buf.oldestPending(); !t.IsZero() {
			lag = max(0, time.Since(t).Seconds())
		}
		st.LagSeconds = &lag
	}
	if st.Error == "" && s.fatal != nil {
		st.Error = s.fatal.Error()
	}
	s.mu.Unlock()
	if st.LagSeconds == nil && c.slot.active {
		var lag pgtype.Interval
		err := s.tab.pool.QueryRow(ctx, `SELECT flush_lag FROM pg_stat_replication WHERE pid = $1`, c.slot.activePID).Scan(&lag)
		if err != nil && !errors.Is(err, pgx.ErrNoRows) {
			return nil, wrapErr("slot status", s.opts, err)
		}
		secs := 0.0
		if lag.Valid {
			secs = float64(lag.Microseconds)/1e6 + float64(lag.Days)*86400
		}
		st.LagSeconds = &secs
	}
	return st, nil
}

// headersJSON encodes headers for the jsonb column, nil when there are none.
func headersJSON(h map[string]string) *string {
	if len(h) == 0 {
		return nil
	}
	b, err := json.Marshal(h)
	if err != nil {
		return nil // a map of strings always encodes
	}
	js := string(b)
	return &js
}
