package dynamodb

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
)

// Attribute names of message items. Times are Unix microseconds (numbers);
// see README.md for the whole layout.
const (
	attrID                     = "MessageId"              // S, the table's hash key: a UUIDv7
	attrTopic                  = "Topic"                  // S
	attrKey                    = "MessageKey"             // S, absent when the message has no key
	attrPayload                = "Payload"                // B
	attrHeaders                = "Headers"                // M of S, absent when empty
	attrCreatedTime            = "CreatedTime"            // N, Message.CreatedAt
	attrShard                  = "Shard"                  // N, PartitionOf(Key, Shards)
	attrTopicShard             = "TopicShard"             // S, Topic + "_" + Shard
	attrSeq                    = "Seq"                    // N, see seq.go
	attrOutstandingCreatedTime = "OutstandingCreatedTime" // N, = CreatedTime while outstanding
	attrOutstandingSeq         = "OutstandingSeq"         // N, = Seq while outstanding
	attrAttempts               = "Attempts"               // N, failed publish attempts
	attrNextAttemptTime        = "NextAttemptTime"        // N, after a failure
	attrLastError              = "LastError"              // S, after a failure
	attrDeliveryTime           = "DeliveryTime"           // N, once dispatched (with Retention)
	attrDeadLetteredTime       = "DeadLetteredTime"       // N, once dead-lettered
	attrExpiresAt              = "ExpiresAt"              // N, Unix seconds, for DynamoDB TTL

	// Relay coordination items (same table, keys that are not UUIDs).
	attrOwner       = "Owner"       // S, lease holder
	attrEpoch       = "Epoch"       // N, lease fencing token
	attrLeaseExpiry = "LeaseExpiry" // N, lease expiry
	attrNodes       = "Nodes"       // M of N: node → heartbeat expiry
	attrShards      = "Shards"      // N, in the meta item
	attrLayout      = "Layout"      // N, in the meta item
)

// Keys of the coordination items. Message IDs are UUIDs, so these never
// collide with a message.
const (
	metaKey        = "outbox:meta"
	nodesKey       = "outbox:nodes"
	leaseKeyPrefix = "outbox:lease:"
)

// layoutVersion is recorded in the meta item by Migrate.
const layoutVersion = 1

func leaseKey(p int) string { return leaseKeyPrefix + strconv.Itoa(p) }

// indexSpec describes one global secondary index.
type indexSpec struct {
	name        string
	hash, rng   string
	nonKeyAttrs []string // INCLUDE projection; nil: KEYS_ONLY
}

// indexes returns the specs of every index the store uses.
func (s *Store) indexes() []indexSpec {
	ix := s.opts.Indexes
	return []indexSpec{
		{ix.Outstanding, attrTopicShard, attrOutstandingCreatedTime, nil},
		{ix.Delivered, attrTopicShard, attrDeliveryTime, nil},
		{ix.OutstandingAllTopics, attrOutstandingCreatedTime, attrID, []string{attrTopicShard}},
		{ix.DeliveredAllTopics, attrDeliveryTime, attrID, []string{attrTopicShard}},
		{ix.Shard, attrShard, attrOutstandingSeq, nil},
		{ix.DeadLettered, attrDeadLetteredTime, attrID, []string{attrTopicShard}},
	}
}

var attrTypes = map[string]types.ScalarAttributeType{
	attrID:                     types.ScalarAttributeTypeS,
	attrTopicShard:             types.ScalarAttributeTypeS,
	attrOutstandingCreatedTime: types.ScalarAttributeTypeN,
	attrDeliveryTime:           types.ScalarAttributeTypeN,
	attrShard:                  types.ScalarAttributeTypeN,
	attrOutstandingSeq:         types.ScalarAttributeTypeN,
	attrDeadLetteredTime:       types.ScalarAttributeTypeN,
}

// CreateTableInput returns the CreateTable request Migrate sends: the
// table in on-demand (PAY_PER_REQUEST) mode with every index. Infrastructure
// as code can start from it (README.md lists the same layout).
func (s *Store) CreateTableInput() *dynamodb.CreateTableInput {
	in := &dynamodb.CreateTableInput{
		TableName:   aws.String(s.opts.Table),
		BillingMode: types.BillingModePayPerRequest,
		KeySchema:   []types.KeySchemaElement{{AttributeName: aws.String(attrID), KeyType: types.KeyTypeHash}},
	}
	used := map[string]bool{attrID: true}
	for _, ix := range s.indexes() {
		proj := &types.Projection{ProjectionType: types.ProjectionTypeKeysOnly}
		if ix.nonKeyAttrs != nil {
			proj = &types.Projection{ProjectionType: types.ProjectionTypeInclude, NonKeyAttributes: ix.nonKeyAttrs}
		}
		in.GlobalSecondaryIndexes = append(in.GlobalSecondaryIndexes, types.GlobalSecondaryIndex{
			IndexName: aws.String(ix.name),
			KeySchema: []types.KeySchemaElement{
				{AttributeName: aws.String(ix.hash), KeyType: types.KeyTypeHash},
				{AttributeName: aws.String(ix.rng), KeyType: types.KeyTypeRange},
			},
			Projection: proj,
		})
		used[ix.hash], used[ix.rng] = true, true
	}
	for _, name := range sortedKeys(used) {
		in.AttributeDefinitions = append(in.AttributeDefinitions, types.AttributeDefinition{
			AttributeName: aws.String(name), AttributeType: attrTypes[name],
		})
	}
	return in
}

func sortedKeys(m map[string]bool) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// migrateTimeout bounds Migrate's wait for the table to become ACTIVE when
// ctx has no deadline.
const migrateTimeout = 5 * time.Minute

// Migrate creates the table with its indexes (on-demand billing) and waits
// until the table and every index are ACTIVE; then records Shards in the
// table's meta item. On an existing table it checks that every index exists
// with the expected keys, returning an error naming what is missing (see
// the migration guide in README.md), and that Shards matches the recorded
// value. With Retention set it enables TTL on ExpiresAt (endpoints without
// the TTL API, such as dynalite, are tolerated with a warning in the log).
//
// Migrate is idempotent and safe to run from several processes at once.
// Unlike the other methods it waits (polling DescribeTable) and retries
// nothing else.
func (s *Store) Migrate(ctx context.Context) error {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, migrateTimeout)
		defer cancel()
	}
	_, err := s.client.CreateTable(ctx, s.CreateTableInput(), s.callOpts...)
	var inUse *types.ResourceInUseException
	switch {
	case err == nil:
		s.opts.Logger.Info("dynamodb: created table", "table", s.opts.Table)
	case errors.As(err, &inUse):
	default:
		return fmt.Errorf("dynamodb: create table %s: %w", s.opts.Table, err)
	}
	desc, err := s.waitActive(ctx)
	if err != nil {
		return err
	}
	if err := s.checkLayout(desc); err != nil {
		return err
	}
	if err := s.putMeta(ctx); err != nil {
		return err
	}
	if s.opts.Retention > 0 {
		_, err := s.client.UpdateTimeToLive(ctx, &dynamodb.UpdateTimeToLiveInput{
			TableName: aws.String(s.opts.Table),
			TimeToLiveSpecification: &types.TimeToLiveSpecification{
				AttributeName: aws.String(attrExpiresAt), Enabled: aws.Bool(true),
			},
		}, s.callOpts...)
		switch code := errorCode(err); {
		case err == nil:
		case code == "UnknownOperationException":
			s.opts.Logger.Warn("dynamodb: the endpoint has no TTL API; delivered messages will not expire", "table", s.opts.Table)
		case code == "ValidationException":
			// TTL already enabled (DynamoDB refuses to enable it twice).
		default:
			return fmt.Errorf("dynamodb: enable TTL on %s.%s: %w", s.opts.Table, attrExpiresAt, err)
		}
	}
	return nil
}

// waitActive polls DescribeTable until the table and its indexes are ACTIVE.
func (s *Store) waitActive(ctx context.Context) (*types.TableDescription, error) {
	delay := 20 * time.Millisecond
	for {
		out, err := s.client.DescribeTable(ctx, &dynamodb.DescribeTableInput{TableName: aws.String(s.opts.Table)}, s.callOpts...)
		if err != nil {
			return nil, fmt.Errorf("dynamodb: describe table %s: %w", s.opts.Table, err)
		}
		t := out.Table
		ready := t.TableStatus == types.TableStatusActive
		for _, g := range t.GlobalSecondaryIndexes {
			ready = ready && g.IndexStatus == types.IndexStatusActive
		}
		if ready {
			return t, nil
		}
		timer := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			timer.Stop()
			return nil, fmt.Errorf("dynamodb: table %s is not ACTIVE (status %s): %w", s.opts.Table, t.TableStatus, context.Cause(ctx))
		case <-timer.C:
		}
		delay = min(2*delay, 2*time.Second)
	}
}

// checkLayout compares an existing table with the expected layout.
func (s *Store) checkLayout(t *types.TableDescription) error {
	if len(t.KeySchema) != 1 || aws.ToString(t.KeySchema[0].AttributeName) != attrID {
		return fmt.Errorf("dynamodb: table %s must have the single hash key %s; create a new table for the outbox", s.opts.Table, attrID)
	}
	have := map[string]types.GlobalSecondaryIndexDescription{}
	for _, g := range t.GlobalSecondaryIndexes {
		have[aws.ToString(g.IndexName)] = g
	}
	var missing []string
	for _, ix := range s.indexes() {
		g, ok := have[ix.name]
		if !ok {
			missing = append(missing, fmt.Sprintf("%s (hash %s, range %s)", ix.name, ix.hash, ix.rng))
			continue
		}
		if len(g.KeySchema) != 2 || aws.ToString(g.KeySchema[0].AttributeName) != ix.hash || aws.ToString(g.KeySchema[1].AttributeName) != ix.rng {
			return fmt.Errorf("dynamodb: index %s of table %s must have hash key %s and range key %s; add an index with those keys under another name and set it in Options.Indexes (see README.md, Migrating)", ix.name, s.opts.Table, ix.hash, ix.rng)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("dynamodb: table %s lacks the indexes %v; add them (see README.md, Migrating) or set their names in Options.Indexes", s.opts.Table, missing)
	}
	return nil
}

// putMeta records Shards and the layout version, or checks them against
// the recorded ones.
func (s *Store) putMeta(ctx context.Context) error {
	_, err := s.client.PutItem(ctx, &dynamodb.PutItemInput{
		TableName: aws.String(s.opts.Table),
		Item: map[string]types.AttributeValue{
			attrID:     str(metaKey),
			attrShards: num(int64(s.opts.Shards)),
			attrLayout: num(layoutVersion),
		},
		ConditionExpression:      aws.String("attribute_not_exists(#id)"),
		ExpressionAttributeNames: map[string]string{"#id": attrID},
		ReturnConsumedCapacity:   types.ReturnConsumedCapacityTotal,
	}, s.callOpts...)
	if err == nil || !isConditionFailed(err) {
		if err != nil {
			return fmt.Errorf("dynamodb: record shard count: %w", err)
		}
		return nil
	}
	_, err = s.Partitions(ctx)
	return err
}

// DropTable deletes the table and everything in it, for tests and
// benchmarks. It does not wait for the deletion to finish.
func (s *Store) DropTable(ctx context.Context) error {
	_, err := s.client.DeleteTable(ctx, &dynamodb.DeleteTableInput{TableName: s.table}, s.callOpts...)
	if err != nil {
		return fmt.Errorf("dynamodb: delete table %s: %w", s.opts.Table, err)
	}
	return nil
}
