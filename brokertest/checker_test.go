package brokertest

import (
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
)

// check records writes (key, id pairs in commit order) and deliveries (ids
// in delivery order; the key is the written one) and verifies them.
func check(t *testing.T, writes [][2]string, deliveries ...string) Report {
	t.Helper()
	c := NewChecker()
	keys := map[string]string{}
	for _, w := range writes {
		c.Written(w[0], w[1])
		keys[w[1]] = w[0]
	}
	for _, id := range deliveries {
		c.Delivered(Received{ID: id, Key: keys[id]})
	}
	return c.Verify()
}

var abWrites = [][2]string{{"a", "a1"}, {"b", "b1"}, {"a", "a2"}, {"b", "b2"}, {"a", "a3"}}

func TestCheckerInOrder(t *testing.T) {
	// Keys interleave freely; each key is in order.
	r := check(t, abWrites, "b1", "a1", "a2", "b2", "a3")
	if err := r.Err(); err != nil {
		t.Fatal(err)
	}
	if r.Written != 5 || r.DeliveredUnique != 5 || len(r.Duplicates) != 0 {
		t.Fatalf("report %v; want 5 written, 5 delivered, no duplicates", r)
	}
}

func TestCheckerLost(t *testing.T) {
	r := check(t, abWrites, "a1", "b1", "a3")
	if !slices.Equal(r.Lost, []string{"a2", "b2"}) {
		t.Fatalf("Lost = %v; want [a2 b2] in write order", r.Lost)
	}
	// A gap is a loss, not an order violation.
	if len(r.OrderViolations) != 0 {
		t.Fatalf("OrderViolations = %v; want none", r.OrderViolations)
	}
	if err := r.Err(); err == nil || !strings.Contains(err.Error(), "a2") {
		t.Fatalf("Err() = %v; want an error naming a2", err)
	}
}

func TestCheckerDuplicatesAreNotErrors(t *testing.T) {
	// a1's acknowledgement was lost: it is published again after a2 was.
	// Only the first delivery counts for order.
	r := check(t, abWrites, "a1", "a2", "a1", "b1", "b2", "a3", "a3")
	if err := r.Err(); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(r.Duplicates, []string{"a1", "a3"}) {
		t.Fatalf("Duplicates = %v; want [a1 a3]", r.Duplicates)
	}
	if r.DeliveredUnique != 5 {
		t.Fatalf("DeliveredUnique = %d; want 5", r.DeliveredUnique)
	}
}

func TestCheckerOrderViolation(t *testing.T) {
	r := check(t, abWrites, "a2", "a1", "b1", "b2", "a3")
	if len(r.OrderViolations) != 1 || !strings.Contains(r.OrderViolations[0], "a1") || !strings.Contains(r.OrderViolations[0], "a2") {
		t.Fatalf("OrderViolations = %v; want one naming a1 and a2", r.OrderViolations)
	}
	if r.Err() == nil {
		t.Fatal("Err() = nil for an order violation")
	}
	// a3 after a2 but a1 delivered late: still only a1 is out of order.
	r = check(t, abWrites, "a2", "a3", "a1", "b1", "b2")
	if len(r.OrderViolations) != 1 {
		t.Fatalf("OrderViolations = %v; want exactly one (a1)", r.OrderViolations)
	}
}

func TestCheckerNoKeyHasNoOrder(t *testing.T) {
	r := check(t, [][2]string{{"", "x1"}, {"", "x2"}, {"", "x3"}}, "x3", "x1", "x2")
	if err := r.Err(); err != nil {
		t.Fatal(err)
	}
}

func TestCheckerUnknownAndWrongKey(t *testing.T) {
	c := NewChecker()
	c.Written("a", "a1")
	c.Delivered(Received{ID: "a1", Key: "b"})
	c.Delivered(Received{ID: "ghost", Key: "a"})
	r := c.Verify()
	if !slices.Equal(r.Unknown, []string{"ghost"}) {
		t.Fatalf("Unknown = %v; want [ghost]", r.Unknown)
	}
	if len(r.WrongKey) != 1 || !strings.Contains(r.WrongKey[0], "a1") {
		t.Fatalf("WrongKey = %v; want one entry for a1", r.WrongKey)
	}
	if r.Err() == nil {
		t.Fatal("Err() = nil with an unknown delivery")
	}
}

func TestCheckerWrittenTwicePanics(t *testing.T) {
	c := NewChecker()
	c.Written("a", "a1")
	defer func() {
		if recover() == nil {
			t.Fatal("second Written of the same ID did not panic")
		}
	}()
	c.Written("a", "a1")
}

// TestCheckerConcurrent records from many goroutines (run with -race); the
// verdict does not depend on how Written and Delivered interleave.
func TestCheckerConcurrent(t *testing.T) {
	const keys, perKey = 16, 200
	c := NewChecker()
	var wg sync.WaitGroup
	for k := range keys {
		key := fmt.Sprintf("key-%d", k)
		wg.Go(func() {
			for i := range perKey {
				id := fmt.Sprintf("%s-%d", key, i)
				c.Written(key, id)
				c.Delivered(Received{ID: id, Key: key})
			}
		})
		wg.Go(func() { _ = c.Verify() })
	}
	wg.Wait()
	r := c.Verify()
	if err := r.Err(); err != nil {
		t.Fatal(err)
	}
	if r.Written != keys*perKey || r.DeliveredUnique != keys*perKey {
		t.Fatalf("report %v; want %d written and delivered", r, keys*perKey)
	}
}
