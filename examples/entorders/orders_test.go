package entorders_test

import (
	"database/sql"
	"encoding/json"
	"errors"
	"slices"
	"testing"

	entsql "entgo.io/ent/dialect/sql"
	_ "github.com/jackc/pgx/v5/stdlib"

	"github.com/outboxrelay/outbox"
	"github.com/outboxrelay/outbox/examples/entorders"
	"github.com/outboxrelay/outbox/examples/entorders/ent"
	"github.com/outboxrelay/outbox/examples/internal/ordertest"
	"github.com/outboxrelay/outbox/internal/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

func openDB(t *testing.T, dsn string) *sql.DB {
	t.Helper()
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	client := ent.NewClient(ent.Driver(entsql.OpenDB("postgres", db)))
	if err := client.Schema.Create(t.Context()); err != nil {
		t.Fatal(err)
	}
	return db
}

// TestStatusChangesPublishInCommitOrder: T1 updates the order and holds
// its row lock; T2 waits for it; T1 writes and commits, then T2. With the
// default write mode the relay publishes in commit order. A transaction
// that fails after its Write leaves no message.
func TestStatusChangesPublishInCommitOrder(t *testing.T) {
	t.Parallel()
	dsn, store := ordertest.Outbox(t, false)
	db := openDB(t, dsn)
	ctx, w := t.Context(), store.Writer()
	o, err := entorders.PlaceOrder(ctx, db, w, "ada", 1990)
	if err != nil {
		t.Fatal(err)
	}
	updated, release := make(chan struct{}), make(chan struct{})
	t1, t2 := make(chan error, 1), make(chan error, 1)
	go func() {
		t1 <- entorders.ChangeStatus(ctx, db, w, o.ID, "paid", func() { close(updated); <-release })
	}()
	<-updated
	go func() { t2 <- entorders.ChangeStatus(ctx, db, w, o.ID, "shipped", nil) }()
	ordertest.WaitForLockWait(t, dsn) // T2's update waits for T1's row lock
	close(release)
	for _, c := range []chan error{t1, t2} {
		if err := <-c; err != nil {
			t.Fatal(err)
		}
	}
	err = entorders.InTx(ctx, db, func(tx *sql.Tx, client *ent.Client) error {
		if _, err := client.Order.Create().SetCustomer("bob").SetTotal(1).Save(ctx); err != nil {
			return err
		}
		if err := w.WriteSQL(ctx, tx, outbox.Message{Topic: "orders.created", Key: "lost", Payload: []byte(`{}`)}); err != nil {
			return err
		}
		return errors.New("rolled back")
	})
	if err == nil || err.Error() != "rolled back" {
		t.Fatalf("InTx = %v", err)
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
	if n, err := ent.NewClient(ent.Driver(entsql.OpenDB("postgres", db))).Order.Query().Count(ctx); err != nil || n != 1 {
		t.Fatalf("orders after the rollback: %d, %v; want 1", n, err)
	}
}
