package memstore_test

import (
	"testing"

	"github.com/outboxrelay/outbox/internal/memstore"
	"github.com/outboxrelay/outbox/storetest"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// The relay's own tests trust this store; it must behave like a real one.
func TestConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T) storetest.Harness {
		st := memstore.New(8, nil)
		return storetest.Harness{Store: st, Write: st.Write, Partitions: 8}
	})
}
