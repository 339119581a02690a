package postgres

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxrelay/outbox"
)

// BenchmarkWriteKeyLocks measures what Options.KeyLocks costs writers:
// transactions per second of 8 concurrent writers (4 per CPU), each
// transaction one Write and a commit, with and without key locks, on the
// test server (fsync off: commits are cheap, so the locks' share is at its
// largest). Workloads:
//
//   - 1key: one message per transaction, its key one of 100,000 (writers
//     rarely share a key);
//   - 10keys: ten messages per transaction, ten keys of 100,000;
//   - 100keys: a hundred messages of a hundred keys;
//   - 1000keys: a thousand messages of a thousand keys (group locks);
//   - hot: one message per transaction, its key one of 8 (writers of one
//     key wait for each other's commit with key locks, not without).
//
// Run (each run alternates the modes; take medians over several runs):
//
//	for i in 1 2 3 4 5; do go test ./store/postgres -run '^$' -bench WriteKeyLocks -benchtime 3s; done
func BenchmarkWriteKeyLocks(b *testing.B) {
	for _, w := range []struct {
		name       string
		msgs, keys int
	}{{"1key", 1, 100000}, {"10keys", 10, 100000}, {"100keys", 100, 100000}, {"1000keys", 1000, 100000}, {"hot", 1, 8}} {
		for _, locks := range []bool{false, true} {
			mode := "plain"
			if locks {
				mode = "keylocks"
			}
			b.Run(w.name+"/"+mode, func(b *testing.B) {
				st := setup(b, Options{KeyLocks: new(locks), Partitions: outbox.DefaultPartitions}).store
				writer := st.Writer()
				b.SetParallelism(4)
				b.ResetTimer()
				start := time.Now()
				b.RunParallel(func(pb *testing.PB) {
					msgs := make([]outbox.Message, w.msgs)
					for pb.Next() {
						for i := range msgs {
							msgs[i] = outbox.Message{Topic: "bench", Key: fmt.Sprintf("key-%d", rand.IntN(w.keys)), Payload: make([]byte, 200)}
						}
						err := pgx.BeginFunc(b.Context(), st.Pool(), func(tx pgx.Tx) error { return writer.Write(b.Context(), tx, msgs...) })
						if err != nil {
							b.Error(err)
							return
						}
					}
				})
				b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "tx/s")
			})
		}
	}
}
