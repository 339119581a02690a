package mysql

import (
	"context"
	"testing"

	"github.com/outboxrelay/outbox"
	"github.com/outboxrelay/outbox/storetest"
)

func harness(t *testing.T, b *bundle) storetest.Harness {
	return storetest.Harness{
		Store:      b.store,
		Write:      b.write,
		Partitions: testPartitions,
	}
}

func TestConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T) storetest.Harness { return harness(t, setup(t)) })
}

// A row whose headers are valid JSON but not a map of strings is
// dead-lettered alone; the others flow.
func TestUndecodableRowIsDeadLetteredAlone(t *testing.T) {
	t.Parallel()
	b := setup(t)
	storetest.Undecodable(t, harness(t, b), func(ctx context.Context, id string) error {
		_, err := b.store.DB().ExecContext(ctx, `UPDATE `+b.store.n.messages+` SET headers = '{"h": 1}' WHERE id = ?`, id)
		return err
	})
}

var _ = outbox.Message{}
