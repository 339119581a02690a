package sqlcorders_test

import (
	_ "embed"
	"encoding/json"
	"errors"
	"slices"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxrelay/outbox"
	"github.com/outboxrelay/outbox/examples/internal/ordertest"
	"github.com/outboxrelay/outbox/examples/sqlcorders"
	"github.com/outboxrelay/outbox/internal/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

//go:embed schema.sql
var schema string

// TestStatusChangesPublishInCommitOrder: T1 locks the order and holds it;
// T2 waits for the row lock; T1 writes and commits, then T2. With the
// default write mode the relay publishes in commit order. A transaction
// that fails after its Write leaves no message.
func TestStatusChangesPublishInCommitOrder(t *testing.T) {
	t.Parallel()
	dsn, store := ordertest.Outbox(t, false)
	ctx, w := t.Context(), store.Writer()
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	if _, err := pool.Exec(ctx, schema); err != nil {
		t.Fatal(err)
	}
	o, err := sqlcorders.PlaceOrder(ctx, pool, w, "ada", 1990)
	if err != nil {
		t.Fatal(err)
	}
	locked, release := make(chan struct{}), make(chan struct{})
	t1, t2 := make(chan error, 1), make(chan error, 1)
	go func() {
		t1 <- sqlcorders.ChangeStatus(ctx, pool, w, o.ID, "paid", func() { close(locked); <-release })
	}()
	<-locked
	go func() { t2 <- sqlcorders.ChangeStatus(ctx, pool, w, o.ID, "shipped", nil) }()
	ordertest.WaitForLockWait(t, dsn) // T2 waits for T1's row lock
	close(release)
	for _, c := range []chan error{t1, t2} {
		if err := <-c; err != nil {
			t.Fatal(err)
		}
	}
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if err := w.Write(ctx, tx, outbox.Message{Topic: "orders.status_changed", Key: "lost", Payload: []byte(`{}`)}); err != nil {
			return err
		}
		return errors.New("rolled back")
	})
	if err == nil || err.Error() != "rolled back" {
		t.Fatalf("BeginFunc = %v", err)
	}

	rec := ordertest.Relay(t, store)
	var statuses []string
	for _, m := range rec.Published(t, 3) {
		var got struct{ Status string }
		if err := json.Unmarshal(m.Payload, &got); err != nil {
			t.Fatal(err)
		}
		statuses = append(statuses, m.Topic+":"+got.Status)
	}
	if want := []string{"orders.created:placed", "orders.status_changed:paid", "orders.status_changed:shipped"}; !slices.Equal(statuses, want) {
		t.Fatalf("published %v, want %v", statuses, want)
	}
}
