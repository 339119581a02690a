package mysql

// Measurements on a durable MariaDB (innodb_flush_log_at_trx_commit=1,
// log_bin with sync_binlog=1) started by the benchmark: the relay's drain
// rate in both orderings against the seed article's tuned processor ported
// to MySQL, and what an idle and a loaded relay cost the server. The
// publisher acknowledges at once, so the figures are the store's side.
// Performance is measured here, never asserted:
//
//	go test ./store/mysql -run '^$' -bench . -benchtime 1x

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/outboxrelay/outbox"
	"github.com/outboxrelay/outbox/internal/servers"
	"github.com/outboxrelay/outbox/internal/testenv"
)

const (
	benchMessages = 20000
	benchPayload  = 200
	benchKeys     = 1000
	// The seed article's tuned processor: 5 processors, batches of 1000.
	seedWorkers = 5
	seedBatch   = 1000
)

// durable is the benchmarks' server, started once.
var durable struct {
	once sync.Once
	s    *servers.MariaDBServer
	err  error
}

// durableServer starts the server on first use; testenv.Main stops it.
func durableServer(b *testing.B) *servers.MariaDBServer {
	durable.once.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		durable.s, durable.err = servers.StartMariaDB(ctx, servers.MariaDBOptions{Durable: true})
	})
	if durable.err != nil {
		b.Fatalf("durable MariaDB: %v", durable.err)
	}
	return durable.s
}

func benchStore(b *testing.B, db string) *Store {
	s := durableServer(b)
	testenv.ExecMySQL(b, s.URL(), "CREATE DATABASE IF NOT EXISTS `"+db+"`")
	st, err := Open(context.Background(), s.URLFor(db), Options{Partitions: 64})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { st.Close() })
	if err := st.Migrate(context.Background()); err != nil {
		b.Fatal(err)
	}
	return st
}

// ack acknowledges every message at once.
type ack struct{ n atomic.Int64 }

func (a *ack) Publish(_ context.Context, msgs []*outbox.Message) []error {
	a.n.Add(int64(len(msgs)))
	return make([]error, len(msgs))
}
func (a *ack) Close() error { return nil }

func writeBacklog(b *testing.B, st *Store, n int) {
	ctx := context.Background()
	payload := []byte(strings.Repeat("x", benchPayload))
	for i := 0; i < n; i += 500 {
		msgs := make([]outbox.Message, min(500, n-i))
		for j := range msgs {
			msgs[j] = outbox.Message{Topic: "bench", Key: "k" + strconv.Itoa((i+j)%benchKeys), Payload: payload}
		}
		tx, err := st.DB().BeginTx(ctx, nil)
		if err != nil {
			b.Fatal(err)
		}
		if err := st.Write(ctx, tx, msgs...); err != nil {
			b.Fatal(err)
		}
		if err := tx.Commit(); err != nil {
			b.Fatal(err)
		}
	}
}

func outstandingRows(b *testing.B, st *Store) int {
	var n int
	if err := st.DB().QueryRow("SELECT count(*) FROM " + st.n.messages).Scan(&n); err != nil {
		b.Fatal(err)
	}
	return n
}

func benchRelay(b *testing.B, ordering outbox.Ordering) {
	st := benchStore(b, "bench_"+strings.ReplaceAll(string(ordering), "-", "_"))
	for range b.N {
		b.StopTimer()
		writeBacklog(b, st, benchMessages)
		pub := &ack{}
		r, err := outbox.NewRelay(st, pub, outbox.Config{Node: "bench", Ordering: ordering})
		if err != nil {
			b.Fatal(err)
		}
		q0, _ := serverLoad(b, st, durableServer(b).PID())
		b.StartTimer()
		start := time.Now()
		if err := r.Start(context.Background()); err != nil {
			b.Fatal(err)
		}
		for outstandingRows(b, st) > 0 {
			time.Sleep(10 * time.Millisecond) // polling the drain, not synchronising
		}
		took := time.Since(start)
		b.StopTimer()
		q1, _ := serverLoad(b, st, durableServer(b).PID())
		if err := r.Stop(); err != nil {
			b.Fatal(err)
		}
		b.ReportMetric(float64(benchMessages)/took.Seconds(), "msgs/s")
		b.ReportMetric(float64(q1-q0)/benchMessages, "stmts/msg")
	}
}

func BenchmarkRelayKey(b *testing.B)  { benchRelay(b, outbox.OrderingKey) }
func BenchmarkRelayNone(b *testing.B) { benchRelay(b, outbox.OrderingNone) }

// BenchmarkSeedTuned is the seed article's tuned processor ported to
// MySQL: 5 processors, each claiming the 1,000 oldest unprocessed rows with
// SELECT … FOR UPDATE SKIP LOCKED, publishing them, and marking them
// processed with one batched UPDATE, holding its transaction across the
// broker call. MySQL has neither partial indexes nor INCLUDE: the index is
// (processed_on_utc, occurred_on_utc), and UPDATE … FROM (VALUES …)
// becomes an UPDATE joined to a UNION ALL of the rows.
func BenchmarkSeedTuned(b *testing.B) {
	s := durableServer(b)
	testenv.ExecMySQL(b, s.URL(), "CREATE DATABASE IF NOT EXISTS bench_seed")
	cfg, err := ParseURL(s.URLFor("bench_seed"))
	if err != nil {
		b.Fatal(err)
	}
	db, err := sql.Open("mysql", cfg.FormatDSN())
	if err != nil {
		b.Fatal(err)
	}
	defer db.Close()
	ctx := context.Background()
	for _, q := range []string{
		"DROP TABLE IF EXISTS outbox_messages",
		`CREATE TABLE outbox_messages (
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
			b.Fatal(err)
		}
	}
	content := `{"p":"` + strings.Repeat("x", benchPayload-8) + `"}`
	for range b.N {
		b.StopTimer()
		if _, err := db.ExecContext(ctx, "DELETE FROM outbox_messages"); err != nil {
			b.Fatal(err)
		}
		for i := 0; i < benchMessages; i += 500 {
			var q strings.Builder
			q.WriteString("INSERT INTO outbox_messages (id, type, content, occurred_on_utc) VALUES ")
			var args []any
			for j := range min(500, benchMessages-i) {
				if j > 0 {
					q.WriteString(", ")
				}
				q.WriteString("(?, 'bench', ?, UTC_TIMESTAMP(6))")
				id := outbox.NewID()
				args = append(args, []byte(strings.ReplaceAll(id, "-", "")[:16]), content)
			}
			if _, err := db.ExecContext(ctx, q.String(), args...); err != nil {
				b.Fatal(err)
			}
		}
		pub := &ack{}
		b.StartTimer()
		start := time.Now()
		var wg sync.WaitGroup
		errs := make(chan error, seedWorkers)
		for range seedWorkers {
			wg.Go(func() {
				for {
					n, err := seedBatchRun(ctx, db, pub)
					if err != nil {
						errs <- err
						return
					}
					if n == 0 {
						return
					}
				}
			})
		}
		wg.Wait()
		took := time.Since(start)
		b.StopTimer()
		close(errs)
		for err := range errs {
			b.Fatal(err)
		}
		if pub.n.Load() != benchMessages {
			b.Fatalf("published %d, want %d", pub.n.Load(), benchMessages)
		}
		b.ReportMetric(float64(benchMessages)/took.Seconds(), "msgs/s")
	}
}

func seedBatchRun(ctx context.Context, db *sql.DB, pub outbox.Publisher) (int, error) {
	tx, err := db.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelReadCommitted}) // PostgreSQL's default, the article's
	if err != nil {
		return 0, err
	}
	defer tx.Rollback()
	rows, err := tx.QueryContext(ctx, `SELECT id, type, content FROM outbox_messages
WHERE processed_on_utc IS NULL ORDER BY occurred_on_utc LIMIT ? FOR UPDATE SKIP LOCKED`, seedBatch)
	if err != nil {
		return 0, err
	}
	var ids [][]byte
	var msgs []*outbox.Message
	for rows.Next() {
		var id, content []byte
		var typ string
		if err := rows.Scan(&id, &typ, &content); err != nil {
			rows.Close()
			return 0, err
		}
		ids = append(ids, id)
		msgs = append(msgs, &outbox.Message{ID: outbox.NewID(), Topic: typ, Payload: content})
	}
	rows.Close()
	if err := rows.Err(); err != nil || len(msgs) == 0 {
		return 0, err
	}
	perr := pub.Publish(ctx, msgs)
	var q strings.Builder
	q.WriteString("UPDATE outbox_messages t JOIN (")
	args := make([]any, 0, 3*len(ids))
	now := time.Now().UTC()
	for i, id := range ids {
		if i > 0 {
			q.WriteString(" UNION ALL ")
		}
		q.WriteString("SELECT ? AS id, ? AS p, ? AS e")
		var e any
		if perr[i] != nil {
			e = perr[i].Error()
		}
		args = append(args, id, now, e)
	}
	q.WriteString(") v ON t.id = v.id SET t.processed_on_utc = v.p, t.error = v.e")
	if _, err := tx.ExecContext(ctx, q.String(), args...); err != nil {
		return 0, err
	}
	return len(msgs), tx.Commit()
}

// serverLoad reads the server's statement count and CPU time.
func serverLoad(b *testing.B, st *Store, pid int) (questions int64, cpu time.Duration) {
	var name string
	if err := st.DB().QueryRow("SHOW GLOBAL STATUS LIKE 'Questions'").Scan(&name, &questions); err != nil {
		b.Fatal(err)
	}
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		b.Fatal(err)
	}
	f := strings.Fields(string(raw[strings.LastIndexByte(string(raw), ')')+2:]))
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	stt, _ := strconv.ParseInt(f[12], 10, 64)
	return questions, time.Duration(ut+stt) * 10 * time.Millisecond // USER_HZ 100
}

// benchCost measures what a relay (default configuration: 4 workers,
// 500 ms poll) costs the server over 10 s, with writers committing rate
// messages per second (one per transaction) in another process's way: by
// SQL of their own, so that no in-process notification wakes the relay.
func benchCost(b *testing.B, rate int) {
	st := benchStore(b, fmt.Sprintf("bench_cost_%d", rate))
	pid := durableServer(b).PID()
	for range b.N {
		r, err := outbox.NewRelay(st, &ack{}, outbox.Config{Node: "cost"})
		if err != nil {
			b.Fatal(err)
		}
		if err := r.Start(context.Background()); err != nil {
			b.Fatal(err)
		}
		time.Sleep(2 * time.Second) // let it take its leases: a schedule, not a synchronisation
		const window = 10 * time.Second
		q0, c0 := serverLoad(b, st, pid)
		stop := make(chan struct{})
		var wrote atomic.Int64
		var wg sync.WaitGroup
		if rate > 0 {
			other, err := New(st.DB(), Options{}) // New: no commit signal to the relay's Store
			if err != nil {
				b.Fatal(err)
			}
			wg.Go(func() {
				t := time.NewTicker(time.Second / time.Duration(rate))
				defer t.Stop()
				for {
					select {
					case <-stop:
						return
					case <-t.C:
					}
					tx, err := st.DB().BeginTx(context.Background(), nil)
					if err != nil {
						b.Error(err)
						return
					}
					if err := other.Write(context.Background(), tx, outbox.Message{Topic: "cost", Key: strconv.Itoa(int(wrote.Load() % 100))}); err != nil {
						b.Error(err)
						return
					}
					if err := tx.Commit(); err != nil {
						b.Error(err)
						return
					}
					wrote.Add(1)
				}
			})
		}
		time.Sleep(window) // the measurement window
		close(stop)
		wg.Wait()
		q1, c1 := serverLoad(b, st, pid)
		if err := r.Stop(); err != nil {
			b.Fatal(err)
		}
		// Each write is 3 statements (BEGIN, INSERT, COMMIT); the two
		// status reads 2.
		relayStmts := float64(q1-q0-2-3*wrote.Load()) / window.Seconds()
		b.ReportMetric(relayStmts, "relay-stmts/s")
		b.ReportMetric(100*(c1-c0).Seconds()/window.Seconds(), "server-cpu-%")
		b.ReportMetric(float64(wrote.Load())/window.Seconds(), "writes/s")
	}
}

func BenchmarkCostIdle(b *testing.B)   { benchCost(b, 0) }
func BenchmarkCostLoaded(b *testing.B) { benchCost(b, 200) }
