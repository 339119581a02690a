package bunorders_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"slices"
	"testing"

	_ "github.com/jackc/pgx/v5/stdlib"
	"github.com/uptrace/bun"
	"github.com/uptrace/bun/dialect/pgdialect"

	"github.com/outboxrelay/outbox"
	"github.com/outboxrelay/outbox/examples/bunorders"
	"github.com/outboxrelay/outbox/examples/internal/ordertest"
	"github.com/outboxrelay/outbox/internal/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

func openBun(t *testing.T, dsn string) *bun.DB {
	t.Helper()
	sqldb, err := sql.Open("pgx", dsn)
	if err != nil {
		t.Fatal(err)
	}
	db := bun.NewDB(sqldb, pgdialect.New())
	t.Cleanup(func() { db.Close() })
	if _, err := db.NewCreateTable().Model((*bunorders.Order)(nil)).Exec(t.Context()); err != nil {
		t.Fatal(err)
	}
	return db
}

// TestStatusChangesPublishInCommitOrder: T1 locks the order and holds it;
// T2 waits for the row lock; T1 writes and commits, then T2. With the
// default write mode the relay publishes in commit order, because each
// transaction locks the row before it writes. A transaction that fails
// after its Write leaves no message.
func TestStatusChangesPublishInCommitOrder(t *testing.T) {
	t.Parallel()
	dsn, store := ordertest.Outbox(t, false)
	db := openBun(t, dsn)
	ctx, w := t.Context(), store.Writer()
	o, err := bunorders.PlaceOrder(ctx, db, w, "ada", 1990)
	if err != nil {
		t.Fatal(err)
	}
	locked, release := make(chan struct{}), make(chan struct{})
	t1, t2 := make(chan error, 1), make(chan error, 1)
	go func() {
		t1 <- bunorders.ChangeStatus(ctx, db, w, o.ID, "paid", func() { close(locked); <-release })
	}()
	<-locked
	go func() { t2 <- bunorders.ChangeStatus(ctx, db, w, o.ID, "shipped", nil) }()
	ordertest.WaitForLockWait(t, dsn) // T2 waits for T1's row lock
	close(release)
	if err := <-t1; err != nil {
		t.Fatal(err)
	}
	if err := <-t2; err != nil {
		t.Fatal(err)
	}
	// A transaction that fails after its Write leaves no message.
	err = db.RunInTx(ctx, nil, func(ctx context.Context, tx bun.Tx) error {
		if err := w.WriteSQL(ctx, tx.Tx, outbox.Message{Topic: "orders.status_changed", Key: "lost", Payload: []byte(`{}`)}); err != nil {
			return err
		}
		return errors.New("rolled back")
	})
	if err == nil || err.Error() != "rolled back" {
		t.Fatalf("RunInTx = %v", err)
	}

	rec := ordertest.Relay(t, store)
	var statuses []string
	for _, m := range rec.Published(t, 3) {
		var got bunorders.Order
		if err := json.Unmarshal(m.Payload, &got); err != nil {
			t.Fatal(err)
		}
		statuses = append(statuses, m.Topic+":"+got.Status)
	}
	if want := []string{"orders.created:placed", "orders.status_changed:paid", "orders.status_changed:shipped"}; !slices.Equal(statuses, want) {
		t.Fatalf("published %v, want %v", statuses, want)
	}
}
