package sqlite

import (
	"context"
	"testing"

	"github.com/outboxrelay/outbox"
	"github.com/outboxrelay/outbox/storetest"
)

// A row whose headers are valid JSON but not a map of strings is
// dead-lettered alone; the others flow. It used to fail every fetch.
func TestUndecodableRowIsDeadLetteredAlone(t *testing.T) {
	t.Parallel()
	b := setup(t)
	h := storetest.Harness{
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
	storetest.Undecodable(t, h, func(ctx context.Context, id string) error {
		_, err := b.store.DB().ExecContext(ctx, `UPDATE `+b.store.n.messages+` SET headers = '{"h": 1}' WHERE id = ?`, id)
		return err
	})
}
