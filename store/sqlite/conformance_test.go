package sqlite

import (
	"context"
	"testing"

	"github.com/outboxrelay/outbox"
	"github.com/outboxrelay/outbox/storetest"
)

func TestConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T) storetest.Harness {
		b := setup(t)
		return storetest.Harness{
			Store: b.store,
			Write: func(ctx context.Context, msgs ...outbox.Message) error {
				tx, err := b.store.DB().BeginTx(ctx, nil)
				if err != nil {
					return err
				}
				defer tx.Rollback()
				if err := b.store.Write(ctx, tx, msgs...); err != nil {
					return err
				}
				return tx.Commit()
			},
			Partitions: testPartitions,
		}
	})
}
