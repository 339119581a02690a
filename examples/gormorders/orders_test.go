package gormorders_test

import (
	"encoding/json"
	"errors"
	"slices"
	"strconv"
	"testing"

	gormpg "gorm.io/driver/postgres"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/outboxrelay/outbox/examples/gormorders"
	"github.com/outboxrelay/outbox/examples/internal/ordertest"
	"github.com/outboxrelay/outbox/internal/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

func openGORM(t *testing.T, dsn string) *gorm.DB {
	t.Helper()
	db, err := gorm.Open(gormpg.Open(dsn), &gorm.Config{Logger: logger.Discard})
	if err != nil {
		t.Fatal(err)
	}
	sqlDB, err := db.DB()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sqlDB.Close() })
	if err := db.AutoMigrate(&gormorders.Order{}, &gormorders.Payment{}); err != nil {
		t.Fatal(err)
	}
	return db
}

// TestPlaceOrder: the order and its message commit together; a GORM
// transaction that rolls back leaves neither.
func TestPlaceOrder(t *testing.T) {
	t.Parallel()
	dsn, store := ordertest.Outbox(t, false)
	db := openGORM(t, dsn)
	ctx := gormorders.WithWriter(t.Context(), store.Writer())

	err := db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		if err := tx.Create(&gormorders.Payment{OrderID: 999, Amount: 1}).Error; err != nil { // writes its message
			return err
		}
		return errors.New("changed my mind")
	})
	if err == nil || err.Error() != "changed my mind" {
		t.Fatalf("rolled-back transaction: %v", err)
	}
	o, err := gormorders.PlaceOrder(ctx, db, "ada", 1990)
	if err != nil {
		t.Fatal(err)
	}
	rec := ordertest.Relay(t, store)
	msgs := rec.Published(t, 1)
	var got gormorders.Order
	if len(msgs) != 1 || msgs[0].Topic != "orders.created" || msgs[0].Key != strconv.FormatInt(o.ID, 10) || json.Unmarshal(msgs[0].Payload, &got) != nil || got != o {
		t.Fatalf("published %+v; want only orders.created for %+v", msgs, o)
	}
	var payments int64
	if err := db.Model(&gormorders.Payment{}).Count(&payments).Error; err != nil || payments != 0 {
		t.Fatalf("payments after the rollback: %d, %v", payments, err)
	}
}

// TestPaymentsPublishInCommitOrder: two payments of one order, whose
// messages are written (by the AfterCreate hook) before the order's row is
// updated. T1 writes, T2 writes, T2 updates the order and commits, T1
// updates and commits. With the default write mode the relay publishes
// T1's message first, against commit order; with key locks T2's write
// waits for T1's commit, and publish order is commit order.
func TestPaymentsPublishInCommitOrder(t *testing.T) {
	t.Parallel()
	for _, keyLocks := range []bool{false, true} {
		t.Run(map[bool]string{false: "default", true: "key locks"}[keyLocks], func(t *testing.T) {
			t.Parallel()
			dsn, store := ordertest.Outbox(t, keyLocks)
			db := openGORM(t, dsn)
			ctx := gormorders.WithWriter(t.Context(), store.Writer())
			o, err := gormorders.PlaceOrder(ctx, db, "ada", 300)
			if err != nil {
				t.Fatal(err)
			}

			t1Written, release := make(chan struct{}), make(chan struct{})
			t1Done, t2Done := make(chan error, 1), make(chan error, 1)
			go func() {
				t1Done <- gormorders.RecordPayment(ctx, db, o.ID, 100, func() { close(t1Written); <-release })
			}()
			<-t1Written
			go func() { t2Done <- gormorders.RecordPayment(ctx, db, o.ID, 200, nil) }()
			var commitOrder []int64
			if keyLocks {
				ordertest.WaitForLockWait(t, dsn) // T2's write waits for T1's key lock
				close(release)
				mustNil(t, <-t1Done)
				mustNil(t, <-t2Done)
				commitOrder = []int64{100, 200}
			} else {
				mustNil(t, <-t2Done) // T2 wrote after T1 and committed first
				close(release)
				mustNil(t, <-t1Done)
				commitOrder = []int64{200, 100}
			}

			rec := ordertest.Relay(t, store)
			var published []int64
			for _, m := range rec.Published(t, 3) {
				if m.Topic != "payments.recorded" {
					continue
				}
				var p struct{ Amount int64 }
				if err := json.Unmarshal(m.Payload, &p); err != nil {
					t.Fatal(err)
				}
				published = append(published, p.Amount)
			}
			if keyLocks && !slices.Equal(published, commitOrder) {
				t.Fatalf("key locks: published %v, want commit order %v", published, commitOrder)
			}
			if !keyLocks && !slices.Equal(published, []int64{100, 200}) {
				t.Fatalf("default write: published %v; want write order [100 200], which is not commit order %v", published, commitOrder)
			}
		})
	}
}

func mustNil(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
