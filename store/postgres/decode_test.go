package postgres

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/outboxrelay/outbox"
	"github.com/outboxrelay/outbox/storetest"
)

// A row whose headers are valid JSON but not a map of strings (written by
// a non-Go producer or by hand) is dead-lettered alone; the others flow.
// It used to fail every fetch of its worker's partitions, forever.
func TestUndecodableRowIsDeadLetteredAlone(t *testing.T) {
	t.Parallel()
	b := setup(t)
	h := storetest.Harness{
		Store: b.store,
		Write: func(ctx context.Context, msgs ...outbox.Message) error {
			return pgx.BeginFunc(ctx, b.store.Pool(), func(tx pgx.Tx) error {
				return b.store.Writer().Write(ctx, tx, msgs...)
			})
		},
		Partitions: testPartitions,
	}
	storetest.Undecodable(t, h, func(ctx context.Context, id string) error {
		_, err := b.store.Pool().Exec(ctx, `UPDATE `+b.store.n.messages+` SET headers = '{"h": 1, "nested": {"a": "b"}}' WHERE id = $1`, id)
		return err
	})
}
