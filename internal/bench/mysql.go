package bench

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/outboxrelay/outbox"
	"github.com/outboxrelay/outbox/internal/uuid"
	outboxmysql "github.com/outboxrelay/outbox/store/mysql"
)

// The bench on a mysql:// store: relay/key and relay/none (our relay on
// store/mysql) against seed-tuned, the seed article's tuned processor
// ported to MySQL (5 processors claiming the 1,000 oldest rows with FOR
// UPDATE SKIP LOCKED, publishing them and marking them with one batched
// UPDATE, the transaction held across the broker call; MySQL has neither
// partial indexes nor INCLUDE nor UPDATE … FROM (VALUES …): the index is
// (processed_on_utc, occurred_on_utc), the update joins a UNION ALL of the
// rows). Tables of the bench's own (bench_outbox_*, outbox_messages_seed)
// in the URL's database, dropped at the end.

// IsMySQL reports whether store is a mysql:// URL.
func IsMySQL(store string) bool { return scheme(store) == "mysql" }

// MySQLScenarioNames lists the scenarios that run on a MySQL store.
func MySQLScenarioNames() []string { return []string{SeedTunedName, RelayNoneName, RelayKeyName} }

const mysqlPrefix = "bench_outbox"

func runMySQL(ctx context.Context, o Options, names []string) (*Report, error) {
	began := time.Now()
	fmt.Fprintf(o.Notices, "bench: --store is MySQL: running only %s; the naive seed, ceilings, scaling and steady scenarios are PostgreSQL-only\n", strings.Join(names, ", "))
	if o.Broker == "" {
		fmt.Fprintln(o.Notices, brokerNotice(o))
	}
	broker, err := OpenBroker(ctx, o.Broker, o)
	if err != nil {
		return nil, err
	}
	defer broker.Close()
	st, err := outboxmysql.Open(ctx, o.Store, outboxmysql.Options{TablePrefix: mysqlPrefix, MaxPayload: max(o.Payload, outbox.MaxPayloadDefault)})
	if err != nil {
		return nil, fmt.Errorf("bench: %w", err)
	}
	defer st.Close()
	db := st.DB()
	defer dropMySQL(db)
	if err := st.Migrate(ctx); err != nil {
		return nil, fmt.Errorf("bench: %w", err)
	}
	var version, flush, syncBinlog string
	if err := db.QueryRowContext(ctx, "SELECT VERSION(), @@innodb_flush_log_at_trx_commit, @@sync_binlog").Scan(&version, &flush, &syncBinlog); err != nil {
		return nil, fmt.Errorf("bench: %w", err)
	}
	storeName := fmt.Sprintf("mysql (%s, innodb_flush_log_at_trx_commit=%s, sync_binlog=%s)", version, flush, syncBinlog)
	rep := &Report{Store: storeName, Broker: broker.Name, DB: DBExternal, Options: o}
	m := &meter{}
	stopProgress := startProgress(o, m)
	defer stopProgress()
	k := Knobs{Messages: o.Messages, Payload: o.Payload, Keys: o.Keys, Batch: o.Batch, Workers: o.Workers}
	for _, n := range names {
		rep.Results = append(rep.Results, &Result{Scenario: n, Store: storeName, DB: DBExternal, Broker: broker.Name, Workers: k.Workers, Batch: k.Batch, Messages: k.Messages})
	}
	var errs []error
	for round := 1; round <= o.Runs; round++ {
		for _, n := range names {
			res := rep.Result(n)
			if res.Err != "" {
				continue
			}
			m.scenario(n, round, o.Runs)
			var r RunResult
			var err error
			if n == SeedTunedName {
				res.Workers, res.Batch = SeedTunedWorkers, SeedBatch
				r, err = mysqlSeedTuned(ctx, db, broker, m, k)
			} else {
				ordering := outbox.OrderingKey
				if n == RelayNoneName {
					ordering = outbox.OrderingNone
				}
				r, err = mysqlRelay(ctx, st, broker, m, k, ordering)
			}
			if err == nil {
				err = r.check()
			}
			if err != nil {
				if ctx.Err() != nil {
					rep.finishMySQL(began)
					return rep, context.Cause(ctx)
				}
				res.Err = err.Error()
				errs = append(errs, fmt.Errorf("%s: %w", n, err))
				continue
			}
			res.Details = append(res.Details, r)
			res.Failed += r.Failed
		}
	}
	rep.finishMySQL(began)
	return rep, errors.Join(errs...)
}

// finishMySQL is finish without the PostgreSQL targets.
func (r *Report) finishMySQL(began time.Time) {
	r.finish(began)
	r.Targets = []Target{}
}

func dropMySQL(db *sql.DB) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, t := range []string{"messages", "dead_letters", "leases", "relays", "meta", "migrations"} {
		_, _ = db.ExecContext(ctx, "DROP TABLE IF EXISTS `"+mysqlPrefix+"_"+t+"`")
	}
	_, _ = db.ExecContext(ctx, "DROP TABLE IF EXISTS outbox_messages_seed")
}

func mysqlPayload(n int) []byte { return []byte(`{"p":"` + strings.Repeat("x", max(0, n-8)) + `"}`) }

// mysqlRelay writes a backlog of k.Messages over k.Keys keys (untimed),
// then times our relay draining it to the broker.
func mysqlRelay(ctx context.Context, st *outboxmysql.Store, broker *Broker, m *meter, k Knobs, ordering outbox.Ordering) (RunResult, error) {
	if err := broker.Reset(ctx); err != nil {
		return RunResult{}, err
	}
	payload := mysqlPayload(k.Payload)
	for i := 0; i < k.Messages; i += 500 {
		msgs := make([]outbox.Message, min(500, k.Messages-i))
		for j := range msgs {
			msgs[j] = outbox.Message{Topic: "bench.orders", Key: "k" + strconv.Itoa((i+j)%k.Keys), Payload: payload}
		}
		tx, err := st.DB().BeginTx(ctx, nil)
		if err != nil {
			return RunResult{}, err
		}
		if err := st.Write(ctx, tx, msgs...); err != nil {
			tx.Rollback()
			return RunResult{}, err
		}
		if err := tx.Commit(); err != nil {
			return RunResult{}, err
		}
	}
	pub, err := broker.NewPublisher(ctx)
	if err != nil {
		return RunResult{}, err
	}
	defer pub.Close()
	r, err := outbox.NewRelay(st, pub, outbox.Config{Node: "bench", Ordering: ordering, Workers: k.Workers, BatchSize: k.Batch})
	if err != nil {
		return RunResult{}, err
	}
	start := time.Now()
	if err := r.Start(ctx); err != nil {
		return RunResult{}, err
	}
	left := int64(k.Messages)
	err = pollUntil(ctx, "the outbox to drain", func() (bool, int64, error) {
		if err := st.DB().QueryRowContext(ctx, "SELECT count(*) FROM `"+mysqlPrefix+"_messages`").Scan(&left); err != nil {
			return false, 0, err
		}
		m.done.Store(int64(k.Messages) - left)
		return left == 0, int64(k.Messages) - left, nil
	})
	elapsed := time.Since(start)
	stopErr := r.Stop()
	if err := errors.Join(err, stopErr); err != nil {
		return RunResult{}, err
	}
	res := newRun(k.Messages, elapsed)
	res.Left = left
	res.Failed = r.Stats().Failed
	if res.Stored, err = broker.Stored(ctx); err != nil {
		return res, err
	}
	return res, nil
}

// mysqlSeedTuned writes the article's table with a backlog (untimed) and
// times 5 processors draining it.
func mysqlSeedTuned(ctx context.Context, db *sql.DB, broker *Broker, m *meter, k Knobs) (RunResult, error) {
	if err := broker.Reset(ctx); err != nil {
		return RunResult{}, err
	}
	for _, q := range []string{
		"DROP TABLE IF EXISTS outbox_messages_seed",
		`CREATE TABLE outbox_messages_seed (
    id               BINARY(16) PRIMARY KEY,
    type             VARCHAR(255) NOT NULL,
    content          JSON NOT NULL,
    occurred_on_utc  DATETIME(6) NOT NULL,
    processed_on_utc DATETIME(6) NULL,
    error            TEXT NULL,
    KEY idx_outbox_messages_unprocessed (processed_on_utc, occurred_on_utc)
) ENGINE=InnoDB`,
	} {
		if _, err := db.ExecContext(ctx, q); err != nil {
			return RunResult{}, err
		}
	}
	content := mysqlPayload(k.Payload)
	for i := 0; i < k.Messages; i += 500 {
		var q strings.Builder
		q.WriteString("INSERT INTO outbox_messages_seed (id, type, content, occurred_on_utc) VALUES ")
		var args []any
		for j := range min(500, k.Messages-i) {
			if j > 0 {
				q.WriteString(", ")
			}
			q.WriteString("(?, 'bench.orders', ?, UTC_TIMESTAMP(6))")
			id := uuidV4()
			args = append(args, id[:], content)
		}
		if _, err := db.ExecContext(ctx, q.String(), args...); err != nil {
			return RunResult{}, err
		}
	}
	pub, err := broker.NewPublisher(ctx)
	if err != nil {
		return RunResult{}, err
	}
	defer pub.Close()
	var (
		mu     sync.Mutex
		failed int64
		wg     sync.WaitGroup
		errs   []error
	)
	start := time.Now()
	for range SeedTunedWorkers {
		wg.Go(func() {
			for {
				n, f, err := mysqlSeedBatch(ctx, db, pub)
				mu.Lock()
				failed += f
				if err != nil {
					errs = append(errs, err)
				}
				mu.Unlock()
				if err != nil || n == 0 {
					return
				}
				m.done.Add(int64(n))
			}
		})
	}
	wg.Wait()
	res := newRun(k.Messages, time.Since(start))
	if err := errors.Join(errs...); err != nil {
		return res, err
	}
	res.Failed = failed
	if err := db.QueryRowContext(ctx, "SELECT count(*) FROM outbox_messages_seed WHERE processed_on_utc IS NULL").Scan(&res.Left); err != nil {
		return res, err
	}
	if res.Stored, err = broker.Stored(ctx); err != nil {
		return res, err
	}
	return res, nil
}

func mysqlSeedBatch(ctx context.Context, db *sql.DB, pub outbox.Publisher) (int, int64, error) {
	// READ COMMITTED: PostgreSQL's default, under which the article runs.
	tx, err := db.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelReadCommitted})
	if err != nil {
		return 0, 0, err
	}
	defer tx.Rollback()
	rows, err := tx.QueryContext(ctx, `SELECT id, type, content FROM outbox_messages_seed
WHERE processed_on_utc IS NULL ORDER BY occurred_on_utc LIMIT ? FOR UPDATE SKIP LOCKED`, SeedBatch)
	if err != nil {
		return 0, 0, err
	}
	var ids [][]byte
	var msgs []*outbox.Message
	for rows.Next() {
		var id, content []byte
		var typ string
		if err := rows.Scan(&id, &typ, &content); err != nil {
			rows.Close()
			return 0, 0, err
		}
		var u [16]byte
		copy(u[:], id)
		ids = append(ids, id)
		msgs = append(msgs, &outbox.Message{ID: uuid.Format(u), Topic: typ, Payload: content})
	}
	rows.Close()
	if err := rows.Err(); err != nil || len(msgs) == 0 {
		return 0, 0, err
	}
	perr := pub.Publish(ctx, msgs)
	var q strings.Builder
	q.WriteString("UPDATE outbox_messages_seed t JOIN (")
	args := make([]any, 0, 3*len(ids))
	now := time.Now().UTC()
	var failed int64
	for i, id := range ids {
		if i > 0 {
			q.WriteString(" UNION ALL ")
		}
		q.WriteString("SELECT ? AS id, ? AS p, ? AS e")
		var e any
		if i >= len(perr) {
			e = fmt.Sprintf("publisher returned %d results for %d messages", len(perr), len(msgs))
		} else if perr[i] != nil {
			e = perr[i].Error()
		}
		if e != nil {
			failed++
		}
		args = append(args, id, now, e)
	}
	q.WriteString(") v ON t.id = v.id SET t.processed_on_utc = v.p, t.error = v.e")
	if _, err := tx.ExecContext(ctx, q.String(), args...); err != nil {
		return 0, 0, err
	}
	return len(msgs), failed, tx.Commit()
}
