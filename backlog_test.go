package outbox_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/outboxrelay/outbox"
)

func TestBacklogAddHeads(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	at := func(m int) time.Time { return t0.Add(time.Duration(m) * time.Minute) }
	b := &outbox.Backlog{
		Topics: []outbox.TopicBacklog{
			{Topic: "b", Outstanding: 5, OldestCreatedAt: at(10)},
			{Topic: "c", Outstanding: 2, OldestCreatedAt: at(3)},
		},
		Outstanding: 7,
		Exact:       true,
	}
	b.AddHeads([]outbox.TopicBacklog{
		{Topic: "b", Outstanding: 1, OldestCreatedAt: at(1)},  // older than b's sample
		{Topic: "c", Outstanding: 1, OldestCreatedAt: at(4)},  // younger: c keeps 3
		{Topic: "a", Outstanding: 1, OldestCreatedAt: at(20)}, // missed by the sample
	})
	want := []outbox.TopicBacklog{
		{Topic: "a", Outstanding: 1, OldestCreatedAt: at(20)},
		{Topic: "b", Outstanding: 5, OldestCreatedAt: at(1)},
		{Topic: "c", Outstanding: 2, OldestCreatedAt: at(3)},
	}
	if fmt.Sprint(b.Topics) != fmt.Sprint(want) {
		t.Errorf("Topics = %v, want %v", b.Topics, want)
	}
	if !b.OldestCreatedAt.Equal(at(1)) || b.Outstanding != 8 || b.Exact {
		t.Errorf("OldestCreatedAt %v, Outstanding %d, Exact %v; want %v, 8, false (a topic the sample missed)", b.OldestCreatedAt, b.Outstanding, b.Exact, at(1))
	}

	empty := &outbox.Backlog{Exact: true}
	empty.AddHeads(nil)
	if empty.Topics == nil || len(empty.Topics) != 0 || !empty.OldestCreatedAt.IsZero() || !empty.Exact {
		t.Errorf("empty backlog after AddHeads(nil) = %+v, want exact, no topics (non-nil), no oldest", empty)
	}

	full := &outbox.Backlog{}
	for i := range outbox.BacklogTopicsMax {
		full.Topics = append(full.Topics, outbox.TopicBacklog{Topic: fmt.Sprintf("t%04d", i), Outstanding: 1, OldestCreatedAt: at(5)})
	}
	full.AddHeads([]outbox.TopicBacklog{{Topic: "zzz", Outstanding: 1, OldestCreatedAt: at(0)}})
	if len(full.Topics) != outbox.BacklogTopicsMax || !full.OldestCreatedAt.Equal(at(0)) {
		t.Errorf("at BacklogTopicsMax topics: %d topics, oldest %v; want %d (no more), %v (the head still counts)", len(full.Topics), full.OldestCreatedAt, outbox.BacklogTopicsMax, at(0))
	}
}
