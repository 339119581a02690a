package dynamodb

import (
	"context"
	"testing"

	"github.com/outboxrelay/outbox"
	"github.com/outboxrelay/outbox/storetest"
)

// TestConformance runs the store conformance suite against dynalite, with a
// fresh table per subtest.
//
// The harness's Write stands in for the caller's TransactWriteItems:
// dynalite has no TransactWriteItems, so each message's TransactWriteItem is
// applied as the equivalent single-item PutItem (same item, same
// condition). Unlike a transaction, a failure midway leaves the earlier
// messages written.
func TestConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T) storetest.Harness {
		s := newStore(t, Options{Shards: 8})
		return storetest.Harness{
			Store:      s,
			Write:      func(ctx context.Context, msgs ...outbox.Message) error { return applyAsPuts(ctx, s, msgs) },
			Partitions: 8,
		}
	})
}
