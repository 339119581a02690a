package dynamodb

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
)

// DynamoDB's batch limits.
const (
	batchGetMax   = 100
	batchWriteMax = 25
)

// parallel runs fn(0), …, fn(n-1) with at most limit running at once and
// returns the first error; after an error no more calls are started and
// the context passed to the running ones is cancelled.
func parallel(ctx context.Context, n, limit int, fn func(ctx context.Context, i int) error) error {
	if n == 0 {
		return nil
	}
	if n == 1 {
		return fn(ctx, 0)
	}
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	sem := make(chan struct{}, max(1, limit))
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		firstErr error
	)
	for i := 0; i < n; i++ {
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
		}
		if ctx.Err() != nil {
			break
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			if err := fn(ctx, i); err != nil {
				mu.Lock()
				if firstErr == nil {
					firstErr = err
					cancel(err)
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if firstErr == nil && ctx.Err() != nil {
		return context.Cause(ctx)
	}
	return firstErr
}

// chunks splits ids into slices of at most size, dropping duplicates
// (DynamoDB refuses a batch holding a key twice).
func chunks(ids []string, size int) [][]string {
	seen := make(map[string]bool, len(ids))
	var out [][]string
	var cur []string
	for _, id := range ids {
		if seen[id] {
			continue
		}
		seen[id] = true
		cur = append(cur, id)
		if len(cur) == size {
			out = append(out, cur)
			cur = nil
		}
	}
	if len(cur) > 0 {
		out = append(out, cur)
	}
	return out
}

// backoff waits before the attempt-th resend (attempt ≥ 1) of unprocessed
// keys or items: UnprocessedBackoff × 2^(attempt-1), capped, with jitter
// between half and all of it.
func (s *Store) backoff(ctx context.Context, attempt int) error {
	d := s.opts.UnprocessedBackoff << min(attempt-1, 20)
	d = min(d, UnprocessedBackoffMax)
	d = d/2 + rand.N(d/2+1)
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return context.Cause(ctx)
	case <-t.C:
		return nil
	}
}

// projection is a ProjectionExpression with its attribute names.
type projection struct {
	expr  string
	names map[string]string
}

// batchGet reads the items with the given keys (IDs or coordination
// keys), returning those found keyed by MessageId. proj, if not nil,
// limits the attributes read (the MessageId must be among them).
func (s *Store) batchGet(ctx context.Context, ids []string, consistent bool, proj *projection) (map[string]map[string]types.AttributeValue, error) {
	parts := chunks(ids, batchGetMax)
	var mu sync.Mutex
	found := make(map[string]map[string]types.AttributeValue, len(ids))
	err := parallel(ctx, len(parts), s.opts.Concurrency, func(ctx context.Context, i int) error {
		keys := make([]map[string]types.AttributeValue, len(parts[i]))
		for j, id := range parts[i] {
			keys[j] = keyOf(id)
		}
		ka := types.KeysAndAttributes{Keys: keys, ConsistentRead: aws.Bool(consistent)}
		if proj != nil {
			ka.ProjectionExpression = aws.String(proj.expr)
			ka.ExpressionAttributeNames = proj.names
		}
		req := map[string]types.KeysAndAttributes{s.opts.Table: ka}
		for attempt := 0; ; attempt++ {
			if attempt > 0 {
				if err := s.backoff(ctx, attempt); err != nil {
					return err
				}
			}
			out, err := s.client.BatchGetItem(ctx, &dynamodb.BatchGetItemInput{
				RequestItems:           req,
				ReturnConsumedCapacity: types.ReturnConsumedCapacityTotal,
			}, s.callOpts...)
			if err != nil {
				return fmt.Errorf("dynamodb: batch get: %w", err)
			}
			mu.Lock()
			for _, item := range out.Responses[s.opts.Table] {
				found[getS(item, attrID)] = item
			}
			mu.Unlock()
			un, ok := out.UnprocessedKeys[s.opts.Table]
			if !ok || len(un.Keys) == 0 {
				return nil
			}
			if attempt+1 >= s.opts.UnprocessedAttempts {
				return fmt.Errorf("dynamodb: batch get: %d key(s) still unprocessed after %d requests; DynamoDB is throttling: retry later or raise the table's read capacity", len(un.Keys), attempt+1)
			}
			req = map[string]types.KeysAndAttributes{s.opts.Table: un}
		}
	})
	if err != nil {
		return nil, err
	}
	return found, nil
}

// batchDelete deletes the items with BatchWriteItem, resending
// unprocessed items with backoff.
func (s *Store) batchDelete(ctx context.Context, ids []string) error {
	parts := chunks(ids, batchWriteMax)
	return parallel(ctx, len(parts), s.opts.Concurrency, func(ctx context.Context, i int) error {
		reqs := make([]types.WriteRequest, len(parts[i]))
		for j, id := range parts[i] {
			reqs[j] = types.WriteRequest{DeleteRequest: &types.DeleteRequest{Key: keyOf(id)}}
		}
		return s.batchWrite(ctx, reqs, "batch delete", "delete")
	})
}

// batchWrite sends reqs (at most batchWriteMax) with BatchWriteItem,
// resending the unprocessed ones with backoff, in UnprocessedAttempts
// requests at most. op names the call in errors ("batch delete"), noun one
// request ("delete").
func (s *Store) batchWrite(ctx context.Context, reqs []types.WriteRequest, op, noun string) error {
	for attempt := 0; ; attempt++ {
		if attempt > 0 {
			if err := s.backoff(ctx, attempt); err != nil {
				return err
			}
		}
		out, err := s.client.BatchWriteItem(ctx, &dynamodb.BatchWriteItemInput{
			RequestItems:           map[string][]types.WriteRequest{s.opts.Table: reqs},
			ReturnConsumedCapacity: types.ReturnConsumedCapacityTotal,
		}, s.callOpts...)
		if err != nil {
			return fmt.Errorf("dynamodb: %s: %w", op, err)
		}
		if reqs = out.UnprocessedItems[s.opts.Table]; len(reqs) == 0 {
			return nil
		}
		if attempt+1 >= s.opts.UnprocessedAttempts {
			return fmt.Errorf("dynamodb: %s: %d %s(s) still unprocessed after %d requests; DynamoDB is throttling: retry later or raise the table's write capacity", op, len(reqs), noun, attempt+1)
		}
	}
}
