package e2e

import (
	"context"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/outboxrelay/outbox/broker/redis"
	"github.com/outboxrelay/outbox/brokertest"
	"github.com/outboxrelay/outbox/internal/testenv"
)

// redisTarget: the test's own redis-server (appendfsync always) with a
// stream per writer topic, read back from the start (a stream's order is
// its XADD order, which is per-key publish order).
func redisTarget(t *testing.T) *target {
	tg, _ := redisServerTarget(t)
	return tg
}

// redisServerTarget is redisTarget, with its server.
func redisServerTarget(t *testing.T) (*target, *testenv.RedisServer) {
	s := testenv.Redis(t, testenv.RedisOptions{})
	c := s.Client()
	t.Cleanup(func() { c.Close() })
	for _, topic := range writerTopics() {
		if err := c.XGroupCreateMkStream(context.Background(), topic, "readers", "$").Err(); err != nil {
			t.Fatal(err)
		}
	}
	return &target{name: "redis", url: "redis://" + s.Addr(), read: redisReader(c, writerTopics())}, s
}

// redisReader reads streams from their start and feeds every entry to the
// checker; it returns how many it read.
func redisReader(c *goredis.Client, streams []string) func(t *testing.T, ch *brokertest.Checker) int {
	return func(t *testing.T, ch *brokertest.Checker) int {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		got := 0
		for _, stream := range streams {
			entries, err := c.XRange(ctx, stream, "-", "+").Result()
			if err != nil {
				t.Fatalf("XRANGE %s: %v", stream, err)
			}
			for _, e := range entries {
				id, _ := e.Values[redis.FieldID].(string)
				key, _ := e.Values[redis.FieldKey].(string)
				ch.Delivered(brokertest.Received{ID: id, Key: key, Topic: stream})
				got++
			}
		}
		return got
	}
}

// A Redis stream deleted mid-run (with its consumer group) and recreated
// 10 s later: the publisher does not recreate it on its own (NOMKSTREAM),
// so the messages written meanwhile wait, none is dead-lettered, and all
// arrive in key order once the operator recreates it.
func TestMistakeRedisStreamDeletedAndRecreated(t *testing.T) {
	t.Parallel()
	s := testenv.Redis(t, testenv.RedisOptions{})
	c := s.Client()
	t.Cleanup(func() { c.Close() })
	ctx := context.Background()
	create := func() {
		if err := c.XGroupCreateMkStream(ctx, "e2e.a", "readers", "$").Err(); err != nil {
			t.Fatal(err)
		}
	}
	create()
	e := setupWith(t, 8, func(t *testing.T) *target { return &target{name: "redis"} })
	r := mistakeRelay(t, e, "redis://"+s.Addr(), 1)
	before := brokertest.NewChecker()
	writeSome(t, e, before, "e2e.a", 200, 20)
	waitFor(t, "the first messages published", time.Minute, func() bool { return outstanding(t, e) == 0 })
	if err := c.Del(ctx, "e2e.a").Err(); err != nil {
		t.Fatal(err)
	}
	ch := brokertest.NewChecker()
	writeSome(t, e, ch, "e2e.a", 500, 20)
	waitFor(t, "the destination reported blocked", time.Minute, func() bool { return len(r.Blocked()) == 1 })
	time.Sleep(10 * time.Second) // the operator notices after 10 s (the scenario, not a synchronisation)
	noDeadLetters(t, e, r)
	if n, err := c.Exists(ctx, "e2e.a").Result(); err != nil || n != 0 {
		t.Fatalf("the stream exists again before the operator recreated it (%d, %v)", n, err)
	}
	create()
	waitFor(t, "the outbox to drain after the stream came back", time.Minute, func() bool { return outstanding(t, e) == 0 })
	verify(t, &env{target: &target{name: "redis", read: redisReader(c, []string{"e2e.a"})}}, ch)
	noDeadLetters(t, e, r)
	waitFor(t, "unblocked", time.Minute, func() bool { return len(r.Blocked()) == 0 })
}

// An ACL user that loses its right to XADD (an operator's mistake) gets
// NOPERM: the destination is blocked, nothing dead-lettered; once the
// right is granted again, everything arrives in key order.
func TestMistakeRedisAccessDenied(t *testing.T) {
	t.Parallel()
	s := testenv.Redis(t, testenv.RedisOptions{Config: []string{"user relay on >relay-pw ~e2e.* +xadd +ping"}})
	c := s.Client()
	t.Cleanup(func() { c.Close() })
	ctx := context.Background()
	if err := c.XGroupCreateMkStream(ctx, "e2e.a", "readers", "$").Err(); err != nil {
		t.Fatal(err)
	}
	e := setupWith(t, 8, func(t *testing.T) *target { return &target{name: "redis"} })
	r := mistakeRelay(t, e, "redis://relay:relay-pw@"+s.Addr(), 1)
	if err := c.Do(ctx, "ACL", "SETUSER", "relay", "-xadd").Err(); err != nil {
		t.Fatal(err)
	}
	ch := brokertest.NewChecker()
	writeSome(t, e, ch, "e2e.a", 300, 20)
	waitFor(t, "the destination reported blocked (NOPERM)", time.Minute, func() bool {
		b := r.Blocked()
		return len(b) == 1 && strings.Contains(b[0].LastError, "NOPERM")
	})
	noDeadLetters(t, e, r)
	if err := c.Do(ctx, "ACL", "SETUSER", "relay", "+xadd").Err(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the outbox to drain after the right was granted", time.Minute, func() bool { return outstanding(t, e) == 0 })
	verify(t, &env{target: &target{name: "redis", read: redisReader(c, []string{"e2e.a"})}}, ch)
	noDeadLetters(t, e, r)
}

// A Redis outage (the server stopped for 12 s, then started with its
// append-only file) with MaxAttempts 3: publishes fail with the server
// unreachable and cost no attempt; nothing is lost or dead-lettered.
func TestMistakeRedisOutage(t *testing.T) {
	t.Parallel()
	tg, s := redisServerTarget(t)
	e := setupWith(t, 8, func(t *testing.T) *target { return tg })
	r := mistakeRelay(t, e, tg.url, 3)
	ch := brokertest.NewChecker()
	writeSome(t, e, ch, "e2e.w0", 300, 20)
	waitFor(t, "publishing under way", time.Minute, func() bool { return r.Stats().Published > 100 })
	if err := s.Pause(); err != nil {
		t.Fatal(err)
	}
	writeSome(t, e, ch, "e2e.w0", 300, 20)
	waitFor(t, "the outage noticed", time.Minute, func() bool { return len(r.Blocked()) > 0 })
	time.Sleep(12 * time.Second) // the outage (the scenario, not a synchronisation)
	noDeadLetters(t, e, r)
	if err := s.Resume(context.Background()); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the outbox to drain after the outage", 2*time.Minute, func() bool { return outstanding(t, e) == 0 })
	verify(t, e, ch)
	noDeadLetters(t, e, r)
}
