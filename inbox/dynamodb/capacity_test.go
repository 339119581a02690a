package dynamodb_test

import (
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	idyn "github.com/outboxrelay/outbox/inbox/dynamodb"
)

// TestCapacityPlan checks the calculator against the article's worked
// numbers. Sizes use the default keys attribute "idempotency_keys" (16
// bytes) plus the list's 3 bytes: 19 fixed bytes, and KeySize + 1 per key.
func TestCapacityPlan(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		c    idyn.Capacity
		want idyn.Plan
		err  []string // substrings of the error; nil: no error
	}{
		{
			// "5 minutes × 100 RPS = 30,000 keys": with 32-byte keys that is
			// 960 KB, far over 400 KB. 12,411 keys fit (409,581 / 33).
			name: "article: 5 min at 100 RPS with 32-byte keys",
			c:    idyn.Capacity{KeyLifetime: 5 * time.Minute, KeySize: 32, WritesPerSecond: 100},
			want: idyn.Plan{Window: 30000, KeyBytes: 960000, ItemBytes: 990019, WriteUnits: 967, MaxWritesPerSecond: 1, Throttled: true,
				MaxWindow: 12411, MaxKeyLifetime: 124110 * time.Millisecond},
			err: []string{"KeyLifetime", "KeySize", "WritesPerSecond", "at most 2m4.11s", "400 KB"},
		},
		{
			// "400 KB ÷ 32 bytes = 12,500 keys": the article's bound is met
			// exactly (KeyBytes 400,000), but the list's 1 byte per element
			// pushes the item to 412,519 bytes, over DynamoDB's 409,600.
			name: "article: 12,500 keys of 32 bytes",
			c:    idyn.Capacity{KeyLifetime: 125 * time.Second, KeySize: 32, WritesPerSecond: 100},
			want: idyn.Plan{Window: 12500, KeyBytes: 400000, ItemBytes: 412519, WriteUnits: 403, MaxWritesPerSecond: 2, Throttled: true,
				MaxWindow: 12411, MaxKeyLifetime: 124110 * time.Millisecond},
			err: []string{"12500 keys", "412519-byte item"},
		},
		{
			name: "the largest window of 32-byte keys fits",
			c:    idyn.Capacity{KeyLifetime: 124110 * time.Millisecond, KeySize: 32, WritesPerSecond: 100},
			want: idyn.Plan{Window: 12411, KeyBytes: 397152, ItemBytes: 409582, WriteUnits: 400, MaxWritesPerSecond: 2, Throttled: true,
				MaxWindow: 12411, MaxKeyLifetime: 124110 * time.Millisecond},
		},
		{
			// At 1,000 RPS the write bound (1,000 KB/s ÷ item size) allows a
			// 1 KB item: KeyLifetime × KeySize × RPS = 1,000 bytes, so with
			// 10-byte keys KeyLifetime × KeySize = 1,000 byte-milliseconds,
			// a 100 ms lifetime. Exactly, the list overhead makes the item
			// 1,119 bytes: two write units, 500 updates per second.
			name: "article: 10-byte keys at 1,000 RPS, 100 ms",
			c:    idyn.Capacity{KeyLifetime: 100 * time.Millisecond, KeySize: 10, WritesPerSecond: 1000},
			want: idyn.Plan{Window: 100, KeyBytes: 1000, ItemBytes: 1119, WriteUnits: 2, MaxWritesPerSecond: 500, Throttled: true,
				MaxWindow: 37234, MaxKeyLifetime: 37234 * time.Millisecond},
		},
		{
			name: "10-byte keys at 1,000 RPS, 90 ms: one write unit",
			c:    idyn.Capacity{KeyLifetime: 90 * time.Millisecond, KeySize: 10, WritesPerSecond: 1000},
			want: idyn.Plan{Window: 90, KeyBytes: 900, ItemBytes: 1009, WriteUnits: 1, MaxWritesPerSecond: 1000, Throttled: false,
				MaxWindow: 37234, MaxKeyLifetime: 37234 * time.Millisecond},
		},
		{
			name: "default key size with other attributes",
			c:    idyn.Capacity{KeyLifetime: time.Minute, WritesPerSecond: 10, OtherBytes: 200, KeysAttribute: "h"},
			want: idyn.Plan{Window: 600, KeyBytes: 9600, ItemBytes: 200 + 1 + 3 + 600*17, WriteUnits: 11, MaxWritesPerSecond: 90, Throttled: false,
				MaxWindow: (409600 - 204) / 17, MaxKeyLifetime: 2408200 * time.Millisecond},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := tc.c.Plan()
			if got != tc.want {
				t.Errorf("Plan() =\n  %+v\nwant\n  %+v", got, tc.want)
			}
			if tc.err == nil {
				if err != nil {
					t.Fatalf("unexpected error: %v", err)
				}
				return
			}
			if !errors.Is(err, idyn.ErrCapacity) {
				t.Fatalf("err = %v; want ErrCapacity", err)
			}
			for _, s := range tc.err {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("error %q does not mention %q", err, s)
				}
			}
		})
	}
}

func TestCapacityInvalid(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		c     idyn.Capacity
		field string
	}{
		{idyn.Capacity{WritesPerSecond: 1}, "KeyLifetime"},
		{idyn.Capacity{KeyLifetime: time.Second, WritesPerSecond: 1, KeySize: 9}, "KeySize"},
		{idyn.Capacity{KeyLifetime: time.Second, WritesPerSecond: 1, KeySize: 44}, "KeySize"},
		{idyn.Capacity{KeyLifetime: time.Second}, "WritesPerSecond"},
		{idyn.Capacity{KeyLifetime: time.Second, WritesPerSecond: math.NaN()}, "WritesPerSecond"},
		{idyn.Capacity{KeyLifetime: time.Second, WritesPerSecond: math.Inf(1)}, "WritesPerSecond"},
		{idyn.Capacity{KeyLifetime: time.Second, WritesPerSecond: 1, OtherBytes: -1}, "OtherBytes"},
	} {
		_, err := tc.c.Plan()
		if err == nil || !strings.Contains(err.Error(), "Capacity."+tc.field) || errors.Is(err, idyn.ErrCapacity) {
			t.Errorf("%+v: err = %v; want an error naming Capacity.%s", tc.c, err, tc.field)
		}
	}
	// Absurd loads are rejected, not overflowed.
	_, err := idyn.Capacity{KeyLifetime: 1000 * time.Hour, WritesPerSecond: 1e12}.Plan()
	if !errors.Is(err, idyn.ErrCapacity) {
		t.Errorf("huge load: err = %v; want ErrCapacity", err)
	}
}
