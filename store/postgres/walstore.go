package postgres

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxrelay/outbox"

	"github.com/outboxrelay/outbox/internal/storepolicy"
	"github.com/outboxrelay/outbox/internal/uuid"
)

// Compile-time checks of the abilities a WALStore offers.
var (
	_ outbox.StreamStore       = (*WALStore)(nil)
	_ outbox.PartitionNotifier = (*WALStore)(nil)
	_ outbox.SlotReader        = (*WALStore)(nil)
	_ outbox.AdminStore        = (*WALStore)(nil)
)

// ErrSlotLost is wrapped by the errors of a WALStore whose replication slot
// PostgreSQL invalidated (wal_status = lost: the WAL it needed was removed,
// max_slot_wal_keep_size exceeded). Messages written since the slot's
// confirmed position were lost and cannot be recovered from the WAL.
var ErrSlotLost = errors.New("the replication slot was invalidated by PostgreSQL (wal_status = lost): messages written since its confirmed position were LOST")

// ErrWALCaptured is wrapped by the error of a table-mode Store's Requeue
// on an outbox captured from the WAL (its replication slot exists).
var ErrWALCaptured = errors.New("this outbox is captured from the WAL (capture wal)")

// errSlotBusy: another relay streams from the slot; this one stands by.
var errSlotBusy = errors.New("the replication slot is active in another relay: standing by")

// WALStore is the relay side of the WAL capture (Options.Capture =
// CaptureWAL): writers emit their messages into the WAL inside their
// transactions ([Writer.Write]), and one relay process at a time streams
// them from a logical replication slot (pgoutput with messages), in
// commit order, into memory, where the relay's workers fetch and settle
// them. It implements outbox.StreamStore (the relay holding the stream owns
// every partition; Seq is commit order, so the relay never sweeps),
// outbox.PartitionNotifier (each captured message wakes its partition's
// worker), outbox.SlotReader and outbox.AdminStore (status, and the
// dead-letter table of the table mode, so `outbox dlq` works unchanged).
//
// # One holder, standbys
//
// PostgreSQL lets one connection stream from a slot. The reader starts
// with the first relay's Hold and takes the slot, or stands by while the
// process of another relay holds it, trying again every
// WALOptions.RetryInterval; the relay is told as soon as the slot is taken
// (the channel Hold returns). A killed holder's connection closes at once,
// so a standby takes over within about RetryInterval; after a network
// partition, within about WALOptions.Timeout + RetryInterval. In one
// process, one relay at a time holds the stream, with every partition;
// other relays of the process on the same WALStore wait for it, and take
// it over, with a new epoch, when it is released. When the last relay
// releases it, the reader confirms the settled position and lets the slot
// go.
//
// # What is confirmed
//
// The position confirmed to PostgreSQL (the slot's confirmed_flush_lsn)
// only covers transactions whose every message was acknowledged by the
// broker or written to the dead letters. A crash therefore publishes again
// only what was not confirmed; a standby taking over starts from there.
// Any copy published twice carries the same ID.
//
// # Bounded memory
//
// At most WALOptions.BufferMessages messages (and BufferBytes of payload)
// are held; beyond that the reader stops reading (it keeps the connection
// alive), whatever the size of the transactions. If the buffer stays full
// with nothing settled for WALOptions.ParkAfter (a destination that stays
// blocked, keys waiting for their retries), what it holds is parked in the
// <prefix>_parked table and capture goes on (see walpark.go): a blocked
// destination holds back only itself, as with table capture.
//
// A WALStore is safe for concurrent use.
type WALStore struct {
	tab    *Store
	opts   Options
	w      WALOptions
	prefix string
	repl   *pgconn.Config
	log    *slog.Logger

	mu      sync.Mutex
	p       int        // partitions; 0 until read
	buf     *walBuffer // nil until the slot is first held
	active  bool       // the reader streams from the slot
	epochs  int64      // slot acquisitions (status)
	fatal   error      // why the reader cannot stream (slot lost, settings), if it cannot
	standby bool       // another relay holds the slot
	// The relays of this process asking for the stream (Hold without
	// Release), in order; holder is the one holding it while the slot is
	// held (the first of them), with its epoch, holdEpoch. changed is
	// closed and replaced whenever that may change.
	wanting   []string
	holder    string
	holdEpoch int64
	changed   chan struct{}
	run       *walRun
	subs      []*walSub
	unwoken   int           // messages captured since the subscribers were woken
	room      chan struct{} // signalled when the full buffer has room again
	recv      pglogrepl.LSN // everything committed before it was received
	recvCond  *sync.Cond    // broadcast when recv advances or the reader stops
	park      walParked     // what the parked table holds (see walpark.go)
	// lastSettle is when a Settle last settled a held message; parkLogged
	// and parkUnlogged rate-limit the parking log.
	lastSettle   time.Time
	parkLogged   time.Time
	parkUnlogged int

	parkedTotal atomic.Int64 // messages parked by this process
	keepalives  atomic.Int64
	statusSent  atomic.Int64
	settleMu    sync.Mutex // one Settle at a time: dead letters go in before their entries leave
	closed      atomic.Bool
}

type walRun struct {
	stop func()
	done chan struct{}
}

type walSub struct {
	dirty map[int]bool
	ch    chan struct{}
}

// OpenWAL connects to the database at dsn with its own pool, like [Open],
// and returns a WALStore (opts.Capture is set to CaptureWAL). The
// replication connection is opened only when a relay asks for the stream
// (Hold) or Start is called.
func OpenWAL(ctx context.Context, dsn string, opts Options) (*WALStore, error) {
	opts.Capture = CaptureWAL
	if err := opts.WithDefaults().validate(); err != nil {
		return nil, err
	}
	tab, err := Open(ctx, dsn, tableOptions(opts))
	if err != nil {
		return nil, err
	}
	s, err := newWALStore(tab, opts)
	if err != nil {
		tab.Close()
		return nil, err
	}
	return s, nil
}

// NewWAL returns a WALStore using the caller's pool, which Close leaves
// open. The replication connection uses the pool's connection settings.
func NewWAL(pool *pgxpool.Pool, opts Options) (*WALStore, error) {
	opts.Capture = CaptureWAL
	if err := opts.WithDefaults().validate(); err != nil {
		return nil, err
	}
	tab, err := New(pool, tableOptions(opts))
	if err != nil {
		return nil, err
	}
	return newWALStore(tab, opts)
}

// tableOptions are the options of the Store holding the tables: the same
// names, table capture (its Fetch and Settle are never used).
func tableOptions(o Options) Options {
	o.Capture = CaptureTable
	return o
}

// SetLogger makes the store log its replication events (slot taken, lost,
// standing by) to l. Call it before the relay starts.
func (s *WALStore) SetLogger(l *slog.Logger) {
	s.mu.Lock()
	s.log = l
	s.mu.Unlock()
}

func newWALStore(tab *Store, opts Options) (*WALStore, error) {
	opts = opts.WithDefaults()
	repl := tab.pool.Config().ConnConfig.Config.Copy()
	if repl.RuntimeParams == nil {
		repl.RuntimeParams = map[string]string{}
	}
	repl.RuntimeParams["replication"] = "database"
	repl.RuntimeParams["wal_sender_timeout"] = fmt.Sprint(opts.WAL.Timeout.Milliseconds())
	if repl.RuntimeParams["application_name"] == "" {
		repl.RuntimeParams["application_name"] = "outbox relay"
	}
	s := &WALStore{
		tab:     tab,
		opts:    opts,
		w:       opts.WAL,
		prefix:  walPrefix(opts),
		repl:    repl,
		log:     slog.New(slog.DiscardHandler),
		room:    make(chan struct{}, 1),
		changed: make(chan struct{}),
	}
	s.recvCond = sync.NewCond(&s.mu)
	return s, nil
}

// Close stops the reader (confirming what is settled), then closes the pool
// if OpenWAL created it. It is idempotent, and returns nil (the error is
// there for the interface every store and publisher shares).
func (s *WALStore) Close() error {
	if s.closed.Swap(true) {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), s.w.Timeout)
	defer cancel()
	s.stopReader(ctx)
	s.mu.Lock()
	for _, sub := range s.subs {
		close(sub.ch)
	}
	s.subs = nil
	s.mu.Unlock()
	return s.tab.Close()
}

// Pool returns the store's connection pool, for the application's own
// transactions.
func (s *WALStore) Pool() *pgxpool.Pool { return s.tab.pool }

// Writer returns a Writer emitting into the WAL with the store's options.
func (s *WALStore) Writer() *Writer {
	w, _ := NewWriter(s.opts) // the options were validated
	return w
}

// Options returns the store's options, with defaults applied.
func (s *WALStore) Options() Options { return s.opts }

// Tables returns the table-mode Store on the same tables (meta, dead
// letters): for administration, never for relaying.
func (s *WALStore) Tables() *Store { return s.tab }

func (s *WALStore) check(op string) error {
	if s.closed.Load() {
		return fmt.Errorf("postgres: %s: %w", op, outbox.ErrClosed)
	}
	return nil
}

// Partitions returns P, read from the meta table.
func (s *WALStore) Partitions(ctx context.Context) (int, error) {
	s.mu.Lock()
	p := s.p
	s.mu.Unlock()
	if p > 0 {
		return p, nil
	}
	p, err := s.tab.Partitions(ctx)
	if err != nil {
		return 0, err
	}
	s.mu.Lock()
	if s.p == 0 {
		s.p = p
		s.park = newWALParked(p)
	}
	s.mu.Unlock()
	return p, nil
}

// Hold asks for the stream for node (see outbox.StreamStore): the reader
// starts if it does not run, taking the slot or standing by. It returns
// the epoch of node's hold while this process streams and node is the
// first of its relays asking, 0 otherwise; if the reader cannot stream at
// all (the slot was lost, a setting must change), that error.
func (s *WALStore) Hold(ctx context.Context, node string) (int64, <-chan struct{}, error) {
	if err := s.check("hold the stream"); err != nil {
		return 0, nil, err
	}
	if _, err := s.Partitions(ctx); err != nil {
		return 0, nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if !slices.Contains(s.wanting, node) {
		s.wanting = append(s.wanting, node)
	}
	s.startReaderLocked()
	s.assignLocked()
	if !s.active && s.fatal != nil {
		return 0, s.changed, s.fatal
	}
	if s.active && s.holder == node {
		return s.holdEpoch, s.changed, nil
	}
	return 0, s.changed, nil
}

// assignLocked gives the stream to the first relay asking while the slot
// is held and no relay holds it, with a new epoch (fencing the
// settlements of any former holder).
func (s *WALStore) assignLocked() {
	if !s.active || s.holder != "" || len(s.wanting) == 0 {
		return
	}
	s.holder = s.wanting[0]
	s.holdEpoch++
	s.changedLocked()
}

// changedLocked tells the relays that Hold's answer may have changed.
func (s *WALStore) changedLocked() {
	close(s.changed)
	s.changed = make(chan struct{})
}

// StopBarrier returns the Seq up to which the held messages must be
// settled for every settled message to be confirmed (see
// outbox.PrefixConfirmer): a graceful stop of the relay publishes them
// first, so that the position it confirms covers everything it published.
func (s *WALStore) StopBarrier() (int64, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.buf == nil || !s.active {
		return 0, true
	}
	seq, complete, _ := s.buf.stopBarrier()
	return seq, complete
}

// Release gives the stream up for node. When no other relay of this
// process asks for it, the reader confirms the settled position and
// releases the slot for a relay of another process. A graceful stop of the
// relay first publishes what lies below its StopBarrier, so it leaves
// nothing to publish twice, but for the messages it could not publish at
// once (a key waiting for a retry, a blocked destination), and the
// messages published past them: those are logged (a WARN with the count)
// and published again, with the same IDs, by the next holder.
func (s *WALStore) Release(ctx context.Context, node string) error {
	if err := s.check("release the stream"); err != nil {
		return err
	}
	s.mu.Lock()
	s.wanting = slices.DeleteFunc(s.wanting, func(n string) bool { return n == node })
	held := s.holder == node
	if held {
		s.holder = ""
		s.changedLocked()
	}
	idle := len(s.wanting) == 0
	var ahead int
	if held && idle && s.buf != nil && s.active {
		_, _, ahead = s.buf.stopBarrier()
	}
	s.assignLocked()
	log := s.log
	s.mu.Unlock()
	if ahead > 0 {
		log.Warn("leaving the slot with messages published past an unsettled one (waiting for a retry or a blocked destination): the confirmed position cannot cover them, and the next relay on the slot publishes them again (same IDs)", "slot", s.w.Slot, "published_again", ahead)
	}
	if idle {
		s.stopReader(ctx)
	}
	return nil
}

// Fetch returns, per cursor, up to limit held records of its partition with
// Seq > After, in Seq (commit) order. Reads are not fenced.
func (s *WALStore) Fetch(ctx context.Context, cursors []outbox.Cursor, limit int) ([]outbox.Record, error) {
	if err := s.check("fetch"); err != nil {
		return nil, err
	}
	s.mu.Lock()
	if s.buf == nil {
		s.mu.Unlock()
		return nil, nil
	}
	var out []outbox.Record
	var parked []outbox.Cursor
	for _, c := range cursors {
		if c.Partition < 0 || c.Partition >= s.buf.p {
			continue
		}
		out = s.buf.fetch(out, c.Partition, c.After, limit)
		if s.parkedBelowLocked(c) {
			parked = append(parked, c)
		}
	}
	s.mu.Unlock()
	if len(parked) == 0 {
		return out, nil
	}
	// The buffer was read first: a record parked since is in both reads,
	// never in neither.
	recs, err := s.fetchParked(ctx, parked, limit)
	if err != nil {
		return nil, err
	}
	return mergeRecords(out, recs, limit), nil
}

// Settle applies settlements of node's current hold (their Lease's Epoch
// is the hold's): delivered records are forgotten, retries updated in
// memory, and dead records written to the dead-letter table first (one
// statement), then forgotten. Only then can the confirmed position move
// past them. The settlements of a former hold are refused
// (*outbox.FencedError).
func (s *WALStore) Settle(ctx context.Context, node string, settlements []outbox.Settlement) error {
	if err := s.check("settle"); err != nil {
		return err
	}
	s.settleMu.Lock()
	defer s.settleMu.Unlock()

	valid := func(st *outbox.Settlement) bool {
		return s.active && s.buf != nil && s.holder == node && st.Epoch == s.holdEpoch && st.Partition >= 0 && st.Partition < s.p
	}
	// The dead letters, with what the buffer holds of them.
	s.mu.Lock()
	var dead []deadRow
	for i := range settlements {
		st := &settlements[i]
		if st.Empty() || !valid(st) {
			continue
		}
		for _, f := range st.Dead {
			if e := s.buf.get(f.ID, st.Partition); e != nil {
				dead = append(dead, deadRow{rec: e.rec, commitLSN: e.txn.commitLSN, attempts: f.Attempts, err: f.Err})
			}
		}
	}
	s.mu.Unlock()
	if len(dead) > 0 {
		if err := s.insertDead(ctx, dead); err != nil {
			return err
		}
	}

	s.mu.Lock()
	settled := false
	fenced := &outbox.FencedError{}
	// Records the buffer no longer holds may be parked.
	var (
		parkedDelivered    []string
		parkedRetry, pDead []outbox.Failure
	)
	mayBeParked := s.park.total > 0
	for i := range settlements {
		st := &settlements[i]
		if st.Empty() {
			continue
		}
		if !valid(st) {
			fenced.Leases = append(fenced.Leases, st.Lease)
			continue
		}
		for _, id := range st.Delivered {
			if e := s.buf.get(id, st.Partition); e != nil {
				s.buf.settle(e)
				settled = true
			} else if mayBeParked {
				parkedDelivered = append(parkedDelivered, id)
			}
		}
		for _, f := range st.Retry {
			if e := s.buf.get(f.ID, st.Partition); e != nil {
				e.rec.Attempts, e.rec.NextAttemptAt, e.rec.LastError = f.Attempts, f.NextAttemptAt, storepolicy.ErrorText(f.Err)
			} else if mayBeParked {
				parkedRetry = append(parkedRetry, f)
			}
		}
		for _, f := range st.Dead {
			if e := s.buf.get(f.ID, st.Partition); e != nil {
				s.buf.settle(e)
				settled = true
			} else if mayBeParked {
				pDead = append(pDead, f)
			}
		}
	}
	if settled { // a reader waiting for room looks again
		s.lastSettle = time.Now()
		select {
		case s.room <- struct{}{}:
		default:
		}
	}
	s.mu.Unlock()
	if len(parkedDelivered)+len(parkedRetry)+len(pDead) > 0 {
		if err := s.settleParked(ctx, parkedDelivered, parkedRetry, pDead); err != nil {
			return err
		}
	}
	if len(fenced.Leases) > 0 {
		return fenced
	}
	return nil
}

// deadRow is a record to dead-letter with its failure.
type deadRow struct {
	rec       outbox.Record
	commitLSN pglogrepl.LSN
	attempts  int
	err       string
}

// insertDead writes rows into the dead-letter table in one statement. The
// seq kept for Requeue's order is the commit position of the message's
// transaction (commit order; within a transaction, CreatedAt then ID).
func (s *WALStore) insertDead(ctx context.Context, rows []deadRow) error {
	n := len(rows)
	var (
		ids      = make([][16]byte, n)
		seqs     = make([]int64, n)
		parts    = make([]int32, n)
		topics   = make([]string, n)
		keys     = make([]string, n)
		payloads = make([][]byte, n)
		headers  = make([]*string, n)
		created  = make([]time.Time, n)
		attempts = make([]int32, n)
		errs     = make([]string, n)
	)
	for i, r := range rows {
		id, err := parseUUID(r.rec.ID)
		if err != nil {
			return fmt.Errorf("postgres: dead-letter %q: %w", r.rec.ID, err)
		}
		ids[i] = id
		seqs[i] = int64(r.commitLSN)
		parts[i] = int32(r.rec.Partition)
		topics[i] = r.rec.Topic
		keys[i] = r.rec.Key
		payloads[i] = r.rec.Payload
		if payloads[i] == nil {
			payloads[i] = []byte{}
		}
		headers[i] = headersJSON(r.rec.Headers)
		created[i] = r.rec.CreatedAt
		attempts[i] = int32(r.attempts)
		errs[i] = storepolicy.ErrorText(r.err)
	}
	_, err := s.tab.pool.Exec(ctx, `INSERT INTO `+s.tab.n.deadLetters+` AS d (id, seq, partition, topic, key, payload, headers, created_at, attempts, last_error, failed_at)
SELECT u.id, u.seq, u.partition, u.topic, u.key, u.payload, u.headers::jsonb, u.created_at, u.attempts, u.err, now()
FROM unnest($1::uuid[], $2::bigint[], $3::integer[], $4::text[], $5::text[], $6::bytea[], $7::text[], $8::timestamptz[], $9::integer[], $10::text[])
    AS u(id, seq, partition, topic, key, payload, headers, created_at, attempts, err)
ON CONFLICT (id) DO UPDATE SET seq = EXCLUDED.seq, partition = EXCLUDED.partition, topic = EXCLUDED.topic, key = EXCLUDED.key,
    payload = EXCLUDED.payload, headers = EXCLUDED.headers, created_at = EXCLUDED.created_at,
    attempts = EXCLUDED.attempts, last_error = EXCLUDED.last_error, failed_at = EXCLUDED.failed_at`,
		ids, seqs, parts, topics, keys, payloads, headers, created, attempts, errs)
	if err != nil {
		return wrapErr("settle: write dead letters", s.opts, err)
	}
	return nil
}

// SubscribePartitions calls fn with the partitions of the messages
// captured since its last call, from one goroutine, until ctx ends or the
// store closes (it then returns nil).
func (s *WALStore) SubscribePartitions(ctx context.Context, fn func(partitions []int)) error {
	if err := s.check("subscribe"); err != nil {
		return err
	}
	sub := &walSub{dirty: map[int]bool{}, ch: make(chan struct{}, 1)}
	s.mu.Lock()
	s.subs = append(s.subs, sub)
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		if i := slices.Index(s.subs, sub); i >= 0 {
			s.subs = slices.Delete(s.subs, i, i+1)
		}
		s.mu.Unlock()
	}()
	fn(nil) // subscribed: what was captured before was not announced
	for {
		select {
		case <-ctx.Done():
			return nil
		case _, ok := <-sub.ch:
			if !ok {
				return nil
			}
		}
		s.mu.Lock()
		parts := make([]int, 0, len(sub.dirty))
		for p := range sub.dirty {
			parts = append(parts, p)
		}
		clear(sub.dirty)
		s.mu.Unlock()
		if len(parts) > 0 {
			slices.Sort(parts)
			fn(parts)
		}
	}
}

// notifyLocked records that partition p got a message, for subscribers.
// The subscribers are woken by wakeLocked, once per transaction (or per
// notifyBatch messages of a large one): a worker then fetches the
// transaction's messages of its partitions together.
func (s *WALStore) notifyLocked(p int) {
	for _, sub := range s.subs {
		sub.dirty[p] = true
	}
	s.unwoken++
	if s.unwoken >= notifyBatch {
		s.wakeLocked()
	}
}

// notifyBatch is how many messages of one transaction are captured before
// the subscribers are woken without waiting for its commit.
const notifyBatch = 256

// wakeLocked wakes the subscribers with partitions to report.
func (s *WALStore) wakeLocked() {
	if s.unwoken == 0 {
		return
	}
	s.unwoken = 0
	for _, sub := range s.subs {
		select {
		case sub.ch <- struct{}{}:
		default:
		}
	}
}

// Sync waits until every transaction committed before the call has been
// received from the slot (and its messages can be fetched), or ctx ends.
// It needs this process to hold the slot. Tests and read-your-writes
// checks use it.
func (s *WALStore) Sync(ctx context.Context) error {
	var lsn pglogrepl.LSN
	if err := s.tab.pool.QueryRow(ctx, `SELECT pg_current_wal_lsn()`).Scan(&lsn); err != nil {
		return wrapErr("sync", s.opts, err)
	}
	return s.waitRecv(ctx, func() (bool, error) {
		if s.recv >= lsn {
			return true, nil
		}
		if err := ctx.Err(); err != nil {
			return false, fmt.Errorf("postgres: sync: received up to %s, waiting for %s: %w", s.recv, lsn, err)
		}
		return false, nil
	})
}

// Requeue moves the dead letters matching f back into the outbox: in one
// transaction it deletes them and emits them into the WAL again, in the
// order of their original commit, with attempts reset. It returns how many
// it moved.
func (s *WALStore) Requeue(ctx context.Context, f outbox.DeadLetterFilter) (int64, error) {
	if err := s.check("requeue"); err != nil {
		return 0, err
	}
	var q sqlBuilder
	q.WriteString(`WITH moved AS (
    DELETE FROM ` + s.tab.n.deadLetters + ` d`)
	if err := deadLetterWhere(&q, f); err != nil {
		return 0, fmt.Errorf("postgres: requeue: %w", err)
	}
	q.WriteString(`
    RETURNING d.id, d.seq, d.topic, d.key, d.payload, d.headers::text, d.created_at
)
SELECT id, topic, key, payload, headers, created_at FROM moved ORDER BY seq NULLS LAST, created_at, id`)
	w := s.Writer()
	var n int64
	err := pgx.BeginFunc(ctx, s.tab.pool, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, q.String(), q.args...)
		if err != nil {
			return err
		}
		msgs, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (outbox.Message, error) {
			var (
				m       outbox.Message
				id      [16]byte
				headers *string
			)
			if err := row.Scan(&id, &m.Topic, &m.Key, &m.Payload, &headers, &m.CreatedAt); err != nil {
				return m, err
			}
			m.ID = uuid.Format(id)
			m.Headers, _ = decodeHeaders(m.ID, headers)
			return m, nil
		})
		if err != nil {
			return err
		}
		// Emitted in batches: one statement per 1,000 messages.
		for chunk := range slices.Chunk(msgs, 1000) {
			if err := w.writeWAL(ctx, tx, chunk); err != nil {
				return err
			}
		}
		n = int64(len(msgs))
		return nil
	})
	if err != nil {
		return 0, wrapErr("requeue", s.opts, err)
	}
	return n, nil
}

// DeadLetters lists dead letters like [Store.DeadLetters].
func (s *WALStore) DeadLetters(ctx context.Context, f outbox.DeadLetterFilter) ([]outbox.DeadLetter, error) {
	return s.tab.DeadLetters(ctx, f)
}

// PurgeDeadLetters deletes dead letters like [Store.PurgeDeadLetters].
func (s *WALStore) PurgeDeadLetters(ctx context.Context, f outbox.DeadLetterFilter) (int64, error) {
	return s.tab.PurgeDeadLetters(ctx, f)
}

// Status describes what this process holds (the backlog in memory, the
// relays asking for the stream and the one holding it), the dead letters and the slot (lag in bytes and
// seconds, and whether it was lost). The backlog of a slot no relay of
// this process holds is in Slot.LagBytes.
func (s *WALStore) Status(ctx context.Context) (*outbox.Status, error) {
	if err := s.check("status"); err != nil {
		return nil, err
	}
	p, err := s.Partitions(ctx)
	if err != nil {
		return nil, err
	}
	slot, err := s.SlotStatus(ctx)
	if err != nil {
		return nil, err
	}
	st := &outbox.Status{Topics: []outbox.TopicCount{}, Partitions: make([]outbox.PartitionStatus, p), Relays: []outbox.RelayStatus{}, Slot: slot}
	if err := s.tab.pool.QueryRow(ctx, `SELECT count(*) FROM `+s.tab.n.deadLetters).Scan(&st.DeadLetters); err != nil {
		return nil, s.tab.wrap("status", err)
	}
	// The parked messages are outstanding (durable, whoever holds the slot).
	parked, err := s.tab.pool.Query(ctx, `SELECT partition, topic, count(*), min(created_at) FROM `+s.tab.n.parked+` GROUP BY partition, topic`)
	if err != nil {
		return nil, s.tab.wrap("status: parked messages", err)
	}
	topics := map[string]*outbox.TopicCount{}
	count := func(part int, topic string, n int64, oldest time.Time) {
		if part >= 0 && part < len(st.Partitions) {
			st.Partitions[part].Outstanding += n
		}
		st.Outstanding += n
		tc := topics[topic]
		if tc == nil {
			tc = &outbox.TopicCount{Topic: topic}
			topics[topic] = tc
		}
		tc.Count += n
		if tc.OldestCreatedAt.IsZero() || oldest.Before(tc.OldestCreatedAt) {
			tc.OldestCreatedAt = oldest
		}
		if st.OldestCreatedAt.IsZero() || oldest.Before(st.OldestCreatedAt) {
			st.OldestCreatedAt = oldest
		}
	}
	var (
		part   int
		topic  string
		n      int64
		oldest time.Time
	)
	if _, err := pgx.ForEachRow(parked, []any{&part, &topic, &n, &oldest}, func() error {
		count(part, topic, n, oldest)
		return nil
	}); err != nil {
		return nil, s.tab.wrap("status: parked messages", err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now := time.Now()
	for i := range st.Partitions {
		ps := &st.Partitions[i]
		ps.Partition = i
		if s.active && s.holder != "" {
			// The hold lasts while the replication connection does: a
			// process gone silent loses the slot within WALOptions.Timeout.
			ps.Epoch, ps.Owner, ps.LeaseExpiresAt = s.holdEpoch, s.holder, now.Add(s.w.Timeout)
		}
		if s.buf == nil {
			continue
		}
		for _, e := range s.buf.parts[i].entries {
			if !e.done {
				count(i, e.rec.Topic, 1, e.rec.CreatedAt)
			}
		}
	}
	for _, tc := range topics {
		st.Topics = append(st.Topics, *tc)
	}
	slices.SortFunc(st.Topics, func(a, b outbox.TopicCount) int {
		if a.Count != b.Count {
			return int(b.Count - a.Count)
		}
		return strings.Compare(a.Topic, b.Topic)
	})
	for _, node := range s.wanting {
		rs := outbox.RelayStatus{Node: node, ExpiresAt: now.Add(s.w.Timeout)}
		if s.active && node == s.holder {
			rs.Partitions = p
		}
		st.Relays = append(st.Relays, rs)
	}
	slices.SortFunc(st.Relays, func(a, b outbox.RelayStatus) int { return strings.Compare(a.Node, b.Node) })
	return st, nil
}

// WALStats are a WALStore's running figures.
type WALStats struct {
	// Active: this process streams from the slot.
	Active bool
	// Buffered and BufferedBytes are the messages held in memory.
	Buffered, BufferedBytes int
	// Confirmed is the position confirmed as settled; Received, the
	// position up to which every committed transaction was received.
	Confirmed, Received string
	// Keepalives counts the server's keepalive messages.
	Keepalives int64
	// Duplicates counts messages dropped because a message with the same
	// ID was held already.
	Duplicates int64
	// Acquisitions counts how many times this process took the slot.
	Acquisitions int64
	// StatusSent counts the confirmed positions sent to the server.
	StatusSent int64
	// Parked is how many messages the parked table holds (see
	// WALOptions.ParkAfter); ParkedTotal, how many this process parked.
	Parked      int
	ParkedTotal int64
}

// Stats returns the store's running figures.
func (s *WALStore) Stats() WALStats {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := WALStats{Active: s.active, Received: s.recv.String(), Keepalives: s.keepalives.Load(), Acquisitions: s.epochs, StatusSent: s.statusSent.Load(),
		Parked: s.park.total, ParkedTotal: s.parkedTotal.Load()}
	if s.buf != nil {
		st.Buffered, st.BufferedBytes = s.buf.n, s.buf.bytes
		st.Confirmed = s.buf.confirmed.String()
		st.Duplicates = s.buf.dups
	}
	return st
}

// CountDeadLetters counts dead letters like [Store.CountDeadLetters].
func (s *WALStore) CountDeadLetters(ctx context.Context, f outbox.DeadLetterFilter) (int64, error) {
	return s.tab.CountDeadLetters(ctx, f)
}

// FindMessages finds messages by ID or key among the dead letters and, in
// the relay process streaming from the slot, the messages it holds in
// memory. Outstanding messages still in the WAL cannot be searched: other
// processes say so in FindResult.Unsearched.
func (s *WALStore) FindMessages(ctx context.Context, q outbox.FindQuery) (*outbox.FindResult, error) {
	limit, err := q.Check()
	if err != nil {
		return nil, err
	}
	res, err := s.tab.FindMessages(ctx, q)
	if err != nil {
		return nil, err
	}
	// The table holds no outstanding message in this mode.
	res.Messages = slices.DeleteFunc(res.Messages, func(m outbox.FoundMessage) bool { return m.State == outbox.StateOutstanding })
	if res.Unsearched == nil {
		res.Unsearched = map[outbox.MessageState]string{}
	}
	delete(res.Unsearched, outbox.StateOutstanding)
	parked, err := s.findParked(ctx, q, limit)
	if err != nil {
		return nil, err
	}
	for _, r := range parked {
		res.Messages = append(res.Messages, outbox.FoundMessage{Record: r, State: outbox.StateOutstanding})
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	isParked := func(id string) bool {
		return slices.ContainsFunc(parked, func(r outbox.Record) bool { return r.ID == id })
	}
	if !s.active || s.buf == nil {
		res.Unsearched[outbox.StateOutstanding] = "capture wal: outstanding messages wait in the replication slot; only the relay process streaming from it holds them (in memory), and this one does not"
		return res, nil
	}
	found := func(e *walEntry) {
		if !isParked(e.rec.ID) {
			res.Messages = append(res.Messages, outbox.FoundMessage{Record: e.rec, State: outbox.StateOutstanding})
		}
	}
	if q.ID != "" {
		if e := s.buf.byID[q.ID]; e != nil {
			found(e)
		}
	} else {
		n := 0
		for _, e := range s.buf.parts[outbox.PartitionOf(q.Key, s.buf.p)].entries {
			if e.done || e.rec.Key != q.Key {
				continue
			}
			if n == limit {
				res.Truncated = true
				break
			}
			found(e)
			n++
		}
	}
	if len(res.Unsearched) == 0 {
		res.Unsearched = nil
	}
	return res, nil
}
