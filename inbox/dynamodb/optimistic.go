package dynamodb

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
)

// ErrConflict is matched (errors.Is) by every *[ConflictError].
var ErrConflict = errors.New("inbox/dynamodb: conflict: the item changed since it was read")

// ConflictError reports a conditional write refused because the item's
// version was not the one the writer read. An API maps it to 409 Conflict,
// or 412 Precondition Failed when the version came from an If-Match header.
type ConflictError struct {
	Table string
	// Expected is the version the write required (0: no item, an item
	// without a version, or one at version 0).
	Expected int64
	// Actual is the stored version when DynamoDB returned the item with the
	// failure (ReturnValuesOnConditionCheckFailure), else -1 (unknown).
	Actual int64
}

func (e *ConflictError) Error() string {
	actual := "unknown"
	if e.Actual >= 0 {
		actual = strconv.FormatInt(e.Actual, 10)
	}
	return fmt.Sprintf("inbox/dynamodb: conflict on table %s: expected version %d, found %s", e.Table, e.Expected, actual)
}

// Is makes errors.Is(err, ErrConflict) true.
func (e *ConflictError) Is(target error) bool { return target == ErrConflict }

// Defaults of [OptimisticConfig].
const (
	VersionAttributeDefault = "version"
	MaxAttemptsDefault      = 10
	BackoffMinDefault       = 5 * time.Millisecond
	BackoffMaxDefault       = 500 * time.Millisecond
)

// OptimisticConfig configures [Optimistic]. Zero fields take their defaults.
type OptimisticConfig struct {
	// Table is the table name. Required.
	Table string
	// VersionAttribute names the number attribute holding the item's
	// version; default [VersionAttributeDefault]. (The article conditions
	// on a lastUpdated timestamp; a counter cannot collide when two writers
	// write within the same clock tick, so the version is a counter. Name
	// the attribute "lastUpdated" if you like.)
	VersionAttribute string
	// MaxAttempts bounds the read-apply-write rounds of Update; default
	// [MaxAttemptsDefault].
	MaxAttempts int
	// BackoffMin and BackoffMax bound the jittered exponential pause
	// between Update's rounds; defaults [BackoffMinDefault] and
	// [BackoffMaxDefault].
	BackoffMin, BackoffMax time.Duration
}

// WithDefaults returns a copy of c with zero fields set to their defaults.
func (c OptimisticConfig) WithDefaults() OptimisticConfig {
	c.VersionAttribute = cmp.Or(c.VersionAttribute, VersionAttributeDefault)
	c.MaxAttempts = cmp.Or(c.MaxAttempts, MaxAttemptsDefault)
	c.BackoffMin = cmp.Or(c.BackoffMin, BackoffMinDefault)
	c.BackoffMax = cmp.Or(c.BackoffMax, max(BackoffMaxDefault, c.BackoffMin))
	return c
}

func (c OptimisticConfig) validate() error {
	switch {
	case c.Table == "":
		return errors.New("inbox/dynamodb: OptimisticConfig.Table is empty: set the table name")
	case c.MaxAttempts < 1 || c.MaxAttempts > 1000:
		return fmt.Errorf("inbox/dynamodb: OptimisticConfig.MaxAttempts must be between 1 and 1000, got %d", c.MaxAttempts)
	case c.BackoffMin <= 0 || c.BackoffMax < c.BackoffMin:
		return fmt.Errorf("inbox/dynamodb: OptimisticConfig.BackoffMin must be positive and at most BackoffMax, got %v and %v", c.BackoffMin, c.BackoffMax)
	}
	return nil
}

// Optimistic does optimistic concurrency control on the items of one table:
// a version number attribute that every write increments, conditionally on
// its previous value. It is safe for concurrent use.
type Optimistic struct {
	client API
	cfg    OptimisticConfig
}

// NewOptimistic returns an Optimistic for cfg.Table.
func NewOptimistic(client API, cfg OptimisticConfig) (*Optimistic, error) {
	if client == nil {
		return nil, errors.New("inbox/dynamodb: NewOptimistic needs a non-nil client")
	}
	cfg = cfg.WithDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	return &Optimistic{client: client, cfg: cfg}, nil
}

// Get reads the item with key, strongly consistently. It returns a nil item
// and version 0 when there is none; an item without the version attribute
// has version 0.
func (o *Optimistic) Get(ctx context.Context, key Item) (Item, int64, error) {
	out, err := o.client.GetItem(ctx, &dynamodb.GetItemInput{
		TableName:      aws.String(o.cfg.Table),
		Key:            key,
		ConsistentRead: aws.Bool(true),
	})
	if err != nil {
		return nil, 0, fmt.Errorf("inbox/dynamodb: get from %s: %w", o.cfg.Table, err)
	}
	if out.Item == nil {
		return nil, 0, nil
	}
	v, err := versionOf(out.Item, o.cfg.VersionAttribute)
	return out.Item, v, err
}

func versionOf(it Item, attr string) (int64, error) {
	av, ok := it[attr]
	if !ok {
		return 0, nil
	}
	n, ok := av.(*types.AttributeValueMemberN)
	if !ok {
		return 0, fmt.Errorf("inbox/dynamodb: attribute %q holds a %T, not a number version", attr, av)
	}
	v, err := strconv.ParseInt(n.Value, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("inbox/dynamodb: attribute %q: version %q is not an integer", attr, n.Value)
	}
	return v, nil
}

// Put writes item (which must hold the primary key) if the stored version
// is still expected (0: no item, one without a version, or one at version
// 0), with version
// expected+1, and returns the new version. If the version changed it returns
// a *[ConflictError]. One request; no retries.
func (o *Optimistic) Put(ctx context.Context, item Item, expected int64) (int64, error) {
	if expected < 0 {
		return 0, fmt.Errorf("inbox/dynamodb: Put: expected version must not be negative, got %d", expected)
	}
	next := expected + 1
	it := copyItem(item)
	it[o.cfg.VersionAttribute] = &types.AttributeValueMemberN{Value: strconv.FormatInt(next, 10)}
	in := &dynamodb.PutItemInput{
		TableName:                           aws.String(o.cfg.Table),
		Item:                                it,
		ExpressionAttributeNames:            map[string]string{"#v": o.cfg.VersionAttribute},
		ReturnValuesOnConditionCheckFailure: types.ReturnValuesOnConditionCheckFailureAllOld,
	}
	in.ExpressionAttributeValues = Item{":expected": &types.AttributeValueMemberN{Value: strconv.FormatInt(expected, 10)}}
	if expected == 0 {
		// Version 0 is no item, an item without a version, or one whose
		// version attribute holds 0 (Get reads all three as 0).
		in.ConditionExpression = aws.String("attribute_not_exists(#v) OR #v = :expected")
	} else {
		in.ConditionExpression = aws.String("#v = :expected")
	}
	if _, err := o.client.PutItem(ctx, in); err != nil {
		var ccf *types.ConditionalCheckFailedException
		if errors.As(err, &ccf) {
			ce := &ConflictError{Table: o.cfg.Table, Expected: expected, Actual: -1}
			if ccf.Item != nil {
				if v, verr := versionOf(ccf.Item, o.cfg.VersionAttribute); verr == nil {
					ce.Actual = v
				}
			}
			return 0, ce
		}
		return 0, fmt.Errorf("inbox/dynamodb: put to %s: %w", o.cfg.Table, err)
	}
	return next, nil
}

// Update reads the item with key, calls change with it (nil if there is
// none; change must not modify it) and writes the item change returns with
// Put, conditionally on the version read. When another writer won the race
// it pauses (jittered exponential backoff), re-reads and calls change again,
// up to MaxAttempts rounds; change must therefore depend only on the item it
// is given. It returns the item written and its version, the error change
// returns (unchanged, nothing written), or after MaxAttempts conflicts the
// last *ConflictError.
func (o *Optimistic) Update(ctx context.Context, key Item, change func(current Item) (Item, error)) (Item, int64, error) {
	var lastErr error
	for attempt := 1; attempt <= o.cfg.MaxAttempts; attempt++ {
		if attempt > 1 {
			if err := sleep(ctx, backoff(attempt-1, o.cfg.BackoffMin, o.cfg.BackoffMax)); err != nil {
				return nil, 0, errors.Join(err, lastErr)
			}
		}
		cur, version, err := o.Get(ctx, key)
		if err != nil {
			return nil, 0, err
		}
		next, err := change(cur)
		if err != nil {
			return nil, 0, err
		}
		it := copyItem(next)
		for k, v := range key {
			it[k] = v
		}
		nv, err := o.Put(ctx, it, version)
		if err == nil {
			it[o.cfg.VersionAttribute] = &types.AttributeValueMemberN{Value: strconv.FormatInt(nv, 10)}
			return it, nv, nil
		}
		if !errors.Is(err, ErrConflict) {
			return nil, 0, err
		}
		lastErr = err
	}
	return nil, 0, fmt.Errorf("inbox/dynamodb: update gave up after %d conflicting attempts: %w", o.cfg.MaxAttempts, lastErr)
}
