package brokertest

import (
	"errors"
	"fmt"
	"strings"
	"sync"
)

// Checker verifies the relay's guarantees from what was written and what a
// consumer received: nothing lost, per-key order of first delivery, and how
// many duplicates. All methods are safe for concurrent use; Written and
// Delivered may be called in any interleaving, as Verify judges only the
// final record.
type Checker struct {
	mu        sync.Mutex
	written   map[string]writtenMsg // by ID
	order     []string              // IDs in the order Written was called
	perKey    map[string]int        // messages written per key so far
	delivered []Received            // in delivery order
}

type writtenMsg struct {
	key   string
	index int // position among the messages of key, in write order
}

// NewChecker returns an empty Checker.
func NewChecker() *Checker {
	return &Checker{written: map[string]writtenMsg{}, perKey: map[string]int{}}
}

// Written records that message id with key was committed. For each key,
// call it in commit order: that order is the one deliveries must follow.
// Messages with an empty key have no order. Recording an ID twice panics.
func (c *Checker) Written(key, id string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, dup := c.written[id]; dup {
		panic(fmt.Sprintf("brokertest: Checker.Written called twice for ID %q", id))
	}
	c.written[id] = writtenMsg{key: key, index: c.perKey[key]}
	c.perKey[key]++
	c.order = append(c.order, id)
}

// Delivered records a delivery to a consumer. Call it in the order the
// broker delivered the messages (per key, at least).
func (c *Checker) Delivered(r Received) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.delivered = append(c.delivered, Received{ID: r.ID, Key: r.Key, Topic: r.Topic})
}

// Report is the outcome of [Checker.Verify]. Slices list IDs (or, for
// OrderViolations, descriptions) in a deterministic order.
type Report struct {
	// Written counts the messages recorded by Written.
	Written int
	// DeliveredUnique counts the written messages delivered at least once.
	DeliveredUnique int
	// Duplicates holds one entry per delivery of an ID already delivered.
	Duplicates []string
	// Lost holds the written IDs never delivered, in write order.
	Lost []string
	// OrderViolations describes each first delivery that came after the
	// first delivery of a later message of the same key.
	OrderViolations []string
	// Unknown holds the delivered IDs that were never written.
	Unknown []string
	// WrongKey describes deliveries whose key differs from the key written.
	WrongKey []string
}

// Err returns an error describing every lost, unknown or wrong-key message
// and every order violation, or nil. Duplicates are not errors (delivery is
// at least once); bound them separately.
func (r Report) Err() error {
	var errs []error
	list := func(what string, s []string) {
		if len(s) > 0 {
			errs = append(errs, fmt.Errorf("%d %s: %s", len(s), what, head(s, 10)))
		}
	}
	list("lost (written, never delivered)", r.Lost)
	list("order violations", r.OrderViolations)
	list("unknown (delivered, never written)", r.Unknown)
	list("delivered with another key than written", r.WrongKey)
	if len(errs) == 0 {
		return nil
	}
	return fmt.Errorf("brokertest: %d written, %d delivered, %d duplicates: %w",
		r.Written, r.DeliveredUnique, len(r.Duplicates), errors.Join(errs...))
}

// String summarises the report on one line.
func (r Report) String() string {
	return fmt.Sprintf("written %d, delivered %d, duplicates %d, lost %d, order violations %d, unknown %d, wrong key %d",
		r.Written, r.DeliveredUnique, len(r.Duplicates), len(r.Lost), len(r.OrderViolations), len(r.Unknown), len(r.WrongKey))
}

func head(s []string, n int) string {
	if len(s) <= n {
		return strings.Join(s, ", ")
	}
	return strings.Join(s[:n], ", ") + fmt.Sprintf(", … (%d more)", len(s)-n)
}

// Verify compares the deliveries with the writes. Per key, the first
// deliveries of the IDs must follow the written order (a lost message is
// reported as lost, not as an order violation); a delivery of an ID already
// delivered is a duplicate; a delivery of an ID never written is unknown.
// Verify may be called more than once, for example while a test waits for
// deliveries to catch up.
func (c *Checker) Verify() Report {
	c.mu.Lock()
	defer c.mu.Unlock()
	r := Report{Written: len(c.written)}
	seen := make(map[string]bool, len(c.written))
	// For each key, the highest write index first-delivered so far, and the
	// ID that had it.
	type last struct {
		index int
		id    string
	}
	latest := map[string]last{}
	for _, d := range c.delivered {
		w, ok := c.written[d.ID]
		if !ok {
			r.Unknown = append(r.Unknown, d.ID)
			continue
		}
		if seen[d.ID] {
			r.Duplicates = append(r.Duplicates, d.ID)
			continue
		}
		seen[d.ID] = true
		r.DeliveredUnique++
		if d.Key != w.key {
			r.WrongKey = append(r.WrongKey, fmt.Sprintf("%s: written with key %q, delivered with key %q", d.ID, w.key, d.Key))
		}
		if w.key == "" {
			continue
		}
		if l, ok := latest[w.key]; ok && w.index < l.index {
			r.OrderViolations = append(r.OrderViolations, fmt.Sprintf("key %q: %s (written #%d) first delivered after %s (written #%d)",
				w.key, d.ID, w.index+1, l.id, l.index+1))
			continue
		}
		latest[w.key] = last{w.index, d.ID}
	}
	for _, id := range c.order {
		if !seen[id] {
			r.Lost = append(r.Lost, id)
		}
	}
	return r
}
