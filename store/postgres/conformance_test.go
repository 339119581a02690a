package postgres

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/outboxrelay/outbox"
	"github.com/outboxrelay/outbox/storetest"
)

func TestConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T) storetest.Harness {
		b := setup(t)
		return storetest.Harness{
			Store: b.store,
			Write: func(ctx context.Context, msgs ...outbox.Message) error {
				return pgx.BeginFunc(ctx, b.store.Pool(), func(tx pgx.Tx) error {
					return b.store.Writer().Write(ctx, tx, msgs...)
				})
			},
			Partitions: testPartitions,
		}
	})
}
