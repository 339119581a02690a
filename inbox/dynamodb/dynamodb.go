// Package dynamodb holds the two tools of "Idempotency in DynamoDB" for
// consumers whose state lives in DynamoDB:
//
//   - [Optimistic]: optimistic concurrency. Every write is conditional on the
//     version the writer read; a write that lost the race fails with a
//     *[ConflictError] (errors.Is(err, [ErrConflict]); map it to HTTP 409 or
//     412), and [Optimistic.Update] re-reads and re-applies a change until it
//     wins or runs out of attempts.
//   - [Window]: idempotent updates without transactions. The item keeps the
//     last N idempotency keys in a list; an update appends its key and drops
//     the oldest in the same conditional UpdateItem, guarded by
//     NOT contains(keys, key), so a repeated key is refused atomically.
//     [Capacity] sizes N and checks it against DynamoDB's item limits.
//
// # The window's update expression
//
// The article writes SET #h = list_append(#h, :k) with REMOVE #h[0] (its
// "DELETE #h[0]" is not valid syntax). DynamoDB rejects that pair too: the
// paths #h and #h[0] overlap ("Two document paths overlap with each other";
// dynalite, which follows DynamoDB's validation, says the same). The Window
// writes instead, with the condition size(#keys) = N AND NOT contains(#keys,
// :key),
//
//	SET #keys[N] = :key REMOVE #keys[0]
//
// Setting the index just past the end of the list appends to it, and the two
// paths do not overlap, so the list keeps its length N with the new key last.
//
// # Keys
//
// An idempotency key (for example an outbox message ID) is stored as the
// first KeySize characters of the base64url encoding of its SHA-256: 16
// characters (96 bits) by default, so the window's size does not depend on
// the keys' length and a collision within a window is negligible
// (N² / 2^97). Keys are stored as strings rather than binary because
// dynalite compares binary list elements after a lossy UTF-8 decoding, which
// would report false duplicates in tests; a string costs 4/3 of the bytes
// for the same entropy.
package dynamodb

import (
	"context"
	"math/rand/v2"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
)

// Item is a DynamoDB item or key.
type Item = map[string]types.AttributeValue

// API is the part of *dynamodb.Client the tools use.
type API interface {
	GetItem(ctx context.Context, in *dynamodb.GetItemInput, optFns ...func(*dynamodb.Options)) (*dynamodb.GetItemOutput, error)
	PutItem(ctx context.Context, in *dynamodb.PutItemInput, optFns ...func(*dynamodb.Options)) (*dynamodb.PutItemOutput, error)
	UpdateItem(ctx context.Context, in *dynamodb.UpdateItemInput, optFns ...func(*dynamodb.Options)) (*dynamodb.UpdateItemOutput, error)
}

var _ API = (*dynamodb.Client)(nil)

// sleep waits d or until ctx ends.
func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return context.Cause(ctx)
	case <-t.C:
		return nil
	}
}

// backoff returns the delay before attempt n+1 (n >= 1): exponential from
// lo, capped at hi, with jitter between half and all of it.
func backoff(n int, lo, hi time.Duration) time.Duration {
	d := hi
	if n < 30 {
		d = min(hi, lo<<(n-1))
	}
	return d/2 + rand.N(d/2+1)
}

// copyItem returns a shallow copy of it.
func copyItem(it Item) Item {
	c := make(Item, len(it)+1)
	for k, v := range it {
		c[k] = v
	}
	return c
}
