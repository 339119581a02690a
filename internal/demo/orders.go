package demo

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"time"

	"golang.org/x/time/rate"

	"github.com/outboxrelay/outbox"
)

// The order service's events, in the order each order emits them. An
// order's stage is the index of its last applied event plus one.
var eventTypes = [eventsPerOrder]string{"order.created", "order.paid", "order.shipped"}

// topicPrefix starts the topics of the events: "orders.created", …
const topicPrefix = "orders."

// order is one order placed by a producer.
type order struct {
	ID       string
	Customer string
	Amount   int64 // cents
}

// event is the payload of an order event. Seq numbers the events of one
// customer (the message key) in commit order: 1, 2, 3, … The consumer
// checks that it sees them in that order.
type event struct {
	Type     string `json:"type"`
	Order    string `json:"order"`
	Customer string `json:"customer"`
	Seq      int64  `json:"seq"`
	Stage    int    `json:"stage"`
	Amount   int64  `json:"amount"`

	id      string    // the message ID (not in the payload)
	created time.Time // the message's CreatedAt (not in the payload)
}

// orderStore is the order service's database: the outbox store, the
// producers' transaction and the consumer's.
type orderStore interface {
	store() outbox.Store
	// placeOrder inserts o and its events in one transaction: it bumps the
	// customer's event sequence by eventsPerOrder (which serialises the
	// customer's writers on the customer's row), inserts the order, and
	// writes the events through the outbox.
	placeOrder(ctx context.Context, o order) error
	// apply records the IDs of evs in the consumer's inbox and advances
	// the orders they are about, in one transaction, and returns the IDs
	// that were not processed before.
	apply(ctx context.Context, evs []event) (map[string]bool, error)
	close()
}

// orderMessages returns the messages of o, whose customer's sequence has
// just reached last.
func orderMessages(o order, last int64) ([]outbox.Message, error) {
	msgs := make([]outbox.Message, eventsPerOrder)
	for i, typ := range eventTypes {
		payload, err := json.Marshal(event{
			Type:     typ,
			Order:    o.ID,
			Customer: o.Customer,
			Seq:      last - eventsPerOrder + 1 + int64(i),
			Stage:    i + 1,
			Amount:   o.Amount,
		})
		if err != nil {
			return nil, err
		}
		msgs[i] = outbox.Message{
			Topic:   topicPrefix + typ[len("order."):],
			Key:     o.Customer,
			Payload: payload,
		}
	}
	return msgs, nil
}

// maxStages returns, for each order of evs, the highest stage among them.
func maxStages(evs []event, fresh map[string]bool) map[string]int {
	m := make(map[string]int)
	for _, e := range evs {
		if fresh[e.id] && e.Stage > m[e.Order] {
			m[e.Order] = e.Stage
		}
	}
	return m
}

// produce places orders until stop ends (or run does), at the limiter's
// rate if not nil. Transactions run with run's context, so that an order in
// progress when stop ends still commits and is counted.
func produce(stop, run context.Context, st orderStore, keys int, limiter *rate.Limiter, rng *rand.Rand, c *counters) error {
	for {
		if limiter != nil {
			if err := limiter.Wait(stop); err != nil {
				return nil // stop ended, or would end before the next token
			}
		} else if stop.Err() != nil {
			return nil
		}
		if stop.Err() != nil {
			return nil
		}
		o := order{
			ID:       outbox.NewID(),
			Customer: fmt.Sprintf("customer-%04d", rng.IntN(keys)),
			Amount:   1 + rng.Int64N(100_000),
		}
		if err := st.placeOrder(run, o); err != nil {
			if run.Err() != nil {
				return nil
			}
			return fmt.Errorf("demo: place order: %w", err)
		}
		c.orders.Add(1)
		c.written.Add(eventsPerOrder)
	}
}

// demoConsumer names the demo's consumer in its inbox.
const demoConsumer = "demo-orders"
