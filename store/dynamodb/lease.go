package dynamodb

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/outboxrelay/outbox"
)

// Relay coordination. Leases and heartbeats are items of the outbox table
// itself (keys outbox:lease:N and outbox:nodes; message IDs are UUIDs, so
// they cannot collide), held with conditional writes: there is no lock
// service and no home-made consensus, only DynamoDB's per-item atomic
// conditional updates. Expiry times come from the relays' clocks (DynamoDB
// has none to offer), so relay hosts need clocks that agree to well within
// LeaseTTL − 2 × PublishTimeout.

var _ outbox.Store = (*Store)(nil)

// Partitions returns the shard count recorded by Migrate, or Options.Shards
// for a table created without Migrate. It is an error when the recorded
// count differs from Options.Shards: writers and relays must agree.
func (s *Store) Partitions(ctx context.Context) (int, error) {
	out, err := s.client.GetItem(ctx, &dynamodb.GetItemInput{
		TableName:              s.table,
		Key:                    keyOf(metaKey),
		ConsistentRead:         aws.Bool(true),
		ReturnConsumedCapacity: types.ReturnConsumedCapacityTotal,
	}, s.callOpts...)
	if err != nil {
		return 0, fmt.Errorf("dynamodb: read shard count: %w", err)
	}
	if out.Item == nil {
		return s.opts.Shards, nil
	}
	n, ok := getN(out.Item, attrShards)
	if !ok {
		return 0, fmt.Errorf("dynamodb: item %s of table %s has no %s", metaKey, s.opts.Table, attrShards)
	}
	if int(n) != s.opts.Shards {
		return 0, fmt.Errorf("dynamodb: table %s was migrated with %d shards but the store is configured with Shards=%d: set Shards (or ?shards=) to %d", s.opts.Table, n, s.opts.Shards, n)
	}
	return int(n), nil
}

// Heartbeat records node in the outbox:nodes item (a map of node to expiry)
// with one UpdateItem and counts the live entries of the returned item.
// Expired entries are then removed with a conditional UpdateItem.
func (s *Store) Heartbeat(ctx context.Context, node string, ttl time.Duration) (int, error) {
	if node == "" {
		return 0, fmt.Errorf("dynamodb: Heartbeat: empty node name")
	}
	now := s.opts.Now()
	in := &dynamodb.UpdateItemInput{
		TableName:                 s.table,
		Key:                       keyOf(nodesKey),
		UpdateExpression:          aws.String("SET #nodes.#n = :exp"),
		ExpressionAttributeNames:  map[string]string{"#nodes": attrNodes, "#n": node},
		ExpressionAttributeValues: map[string]types.AttributeValue{":exp": micros(now.Add(ttl))},
		ReturnValues:              types.ReturnValueAllNew,
		ReturnConsumedCapacity:    types.ReturnConsumedCapacityTotal,
	}
	out, err := s.client.UpdateItem(ctx, in, s.callOpts...)
	if errorCode(err) == "ValidationException" {
		// The nodes item (or its map) does not exist yet: the document
		// path is invalid. Create it, unless another node just did.
		_, err = s.client.UpdateItem(ctx, &dynamodb.UpdateItemInput{
			TableName:                s.table,
			Key:                      keyOf(nodesKey),
			UpdateExpression:         aws.String("SET #nodes = :m"),
			ConditionExpression:      aws.String("attribute_not_exists(#nodes)"),
			ExpressionAttributeNames: map[string]string{"#nodes": attrNodes},
			ExpressionAttributeValues: map[string]types.AttributeValue{":m": &types.AttributeValueMemberM{
				Value: map[string]types.AttributeValue{node: micros(now.Add(ttl))},
			}},
			ReturnValues:           types.ReturnValueAllNew,
			ReturnConsumedCapacity: types.ReturnConsumedCapacityTotal,
		}, s.callOpts...)
		if isConditionFailed(err) {
			out, err = s.client.UpdateItem(ctx, in, s.callOpts...)
		} else if err == nil {
			return 1, nil
		}
	}
	if err != nil {
		return 0, fmt.Errorf("dynamodb: heartbeat of %s: %w", node, err)
	}
	live, expired := liveNodes(out.Attributes, now)
	if len(expired) > 0 {
		if err := s.forgetNodes(ctx, expired, now); err != nil {
			return 0, err
		}
	}
	return len(live), nil
}

// liveNodes splits the entries of a nodes item.
func liveNodes(item map[string]types.AttributeValue, now time.Time) (live map[string]time.Time, expired []string) {
	live = map[string]time.Time{}
	m, _ := item[attrNodes].(*types.AttributeValueMemberM)
	if m == nil {
		return live, nil
	}
	for name, v := range m.Value {
		n, ok := v.(*types.AttributeValueMemberN)
		if !ok {
			continue
		}
		exp, err := strconv.ParseInt(n.Value, 10, 64)
		if err != nil {
			continue
		}
		if exp > now.UnixMicro() {
			live[name] = time.UnixMicro(exp).UTC()
		} else {
			expired = append(expired, name)
		}
	}
	slices.Sort(expired)
	return live, expired
}

// forgetNodes removes expired heartbeat entries, unless renewed meanwhile.
func (s *Store) forgetNodes(ctx context.Context, expired []string, now time.Time) error {
	expired = expired[:min(len(expired), 50)]
	names := map[string]string{"#nodes": attrNodes}
	update, cond := "REMOVE ", ""
	for i, n := range expired {
		p := "#e" + strconv.Itoa(i)
		names[p] = n
		if i > 0 {
			update += ", "
			cond += " AND "
		}
		update += "#nodes." + p
		cond += "#nodes." + p + " < :now"
	}
	_, err := s.client.UpdateItem(ctx, &dynamodb.UpdateItemInput{
		TableName:                 s.table,
		Key:                       keyOf(nodesKey),
		UpdateExpression:          aws.String(update),
		ConditionExpression:       aws.String(cond),
		ExpressionAttributeNames:  names,
		ExpressionAttributeValues: map[string]types.AttributeValue{":now": micros(now)},
		ReturnConsumedCapacity:    types.ReturnConsumedCapacityTotal,
	}, s.callOpts...)
	if err != nil && !isConditionFailed(err) {
		return fmt.Errorf("dynamodb: forget expired relay nodes: %w", err)
	}
	return nil
}

// leaseItem is a decoded lease item.
type leaseItem struct {
	partition int
	owner     string
	epoch     int64
	expiry    time.Time
}

// readLeases reads the lease items of the given partitions with a
// consistent BatchGetItem. Partitions without an item are absent.
func (s *Store) readLeases(ctx context.Context, partitions []int) (map[int]leaseItem, error) {
	keys := make([]string, len(partitions))
	for i, p := range partitions {
		keys[i] = leaseKey(p)
	}
	items, err := s.batchGet(ctx, keys, true, nil)
	if err != nil {
		return nil, fmt.Errorf("dynamodb: read leases: %w", err)
	}
	leases := make(map[int]leaseItem, len(items))
	for _, p := range partitions {
		item, ok := items[leaseKey(p)]
		if !ok {
			continue
		}
		l := leaseItem{partition: p, owner: getS(item, attrOwner)}
		l.epoch, _ = getN(item, attrEpoch)
		l.expiry = getTime(item, attrLeaseExpiry)
		leases[p] = l
	}
	return leases, nil
}

func allPartitions(n int) []int {
	ps := make([]int, n)
	for i := range ps {
		ps[i] = i
	}
	return ps
}

// AcquireLeases renews each held lease with a conditional UpdateItem
// (Owner = node AND Epoch = epoch), reads every lease item with a
// consistent BatchGetItem, then takes free or expired partitions, in
// random order, with conditional UpdateItems (attribute_not_exists(Owner)
// OR LeaseExpiry < now) that increment the epoch, until it
// has want more or none is left. Losing a race for a partition to another
// node is not an error.
func (s *Store) AcquireLeases(ctx context.Context, node string, held []outbox.Lease, want int, ttl time.Duration) ([]outbox.Lease, error) {
	if node == "" {
		return nil, fmt.Errorf("dynamodb: AcquireLeases: empty node name")
	}
	now := s.opts.Now()
	exp := micros(now.Add(ttl))
	var mu sync.Mutex
	var result []outbox.Lease
	err := parallel(ctx, len(held), s.opts.Concurrency, func(ctx context.Context, i int) error {
		l := held[i]
		_, err := s.client.UpdateItem(ctx, &dynamodb.UpdateItemInput{
			TableName:                s.table,
			Key:                      keyOf(leaseKey(l.Partition)),
			UpdateExpression:         aws.String("SET #exp = :exp"),
			ConditionExpression:      aws.String("#owner = :me AND #epoch = :epoch"),
			ExpressionAttributeNames: map[string]string{"#exp": attrLeaseExpiry, "#owner": attrOwner, "#epoch": attrEpoch},
			ExpressionAttributeValues: map[string]types.AttributeValue{
				":exp": exp, ":me": str(node), ":epoch": num(l.Epoch),
			},
			ReturnConsumedCapacity: types.ReturnConsumedCapacityTotal,
		}, s.callOpts...)
		if isConditionFailed(err) {
			return nil // lost
		}
		if err != nil {
			return fmt.Errorf("dynamodb: renew lease of partition %d: %w", l.Partition, err)
		}
		mu.Lock()
		result = append(result, l)
		mu.Unlock()
		return nil
	})
	if err != nil {
		return nil, err
	}
	if want > 0 {
		taken, err := s.takeLeases(ctx, node, result, want, now, exp)
		if err != nil {
			return nil, err
		}
		result = append(result, taken...)
	}
	slices.SortFunc(result, func(a, b outbox.Lease) int { return a.Partition - b.Partition })
	return result, nil
}

func (s *Store) takeLeases(ctx context.Context, node string, renewed []outbox.Lease, want int, now time.Time, exp types.AttributeValue) ([]outbox.Lease, error) {
	mine := map[int]bool{}
	for _, l := range renewed {
		mine[l.Partition] = true
	}
	leases, err := s.readLeases(ctx, allPartitions(s.opts.Shards))
	if err != nil {
		return nil, err
	}
	var candidates []int
	for p := range s.opts.Shards {
		if mine[p] {
			continue
		}
		l, ok := leases[p]
		if !ok || l.owner == "" || !l.expiry.After(now) {
			candidates = append(candidates, p)
		}
	}
	rand.Shuffle(len(candidates), func(i, j int) { candidates[i], candidates[j] = candidates[j], candidates[i] })
	var taken []outbox.Lease
	var mu sync.Mutex
	for len(taken) < want && len(candidates) > 0 {
		try := candidates[:min(want-len(taken), len(candidates))]
		candidates = candidates[len(try):]
		err := parallel(ctx, len(try), s.opts.Concurrency, func(ctx context.Context, i int) error {
			p := try[i]
			out, err := s.client.UpdateItem(ctx, &dynamodb.UpdateItemInput{
				TableName:           s.table,
				Key:                 keyOf(leaseKey(p)),
				UpdateExpression:    aws.String("SET #owner = :me, #epoch = if_not_exists(#epoch, :zero) + :one, #exp = :exp, #shard = :p"),
				ConditionExpression: aws.String("attribute_not_exists(#owner) OR #exp < :now"),
				ExpressionAttributeNames: map[string]string{
					"#owner": attrOwner, "#epoch": attrEpoch, "#exp": attrLeaseExpiry, "#shard": attrShard,
				},
				ExpressionAttributeValues: map[string]types.AttributeValue{
					":me": str(node), ":zero": num(0), ":one": num(1), ":exp": exp,
					":p": num(int64(p)), ":now": micros(now),
				},
				ReturnValues:           types.ReturnValueUpdatedNew,
				ReturnConsumedCapacity: types.ReturnConsumedCapacityTotal,
			}, s.callOpts...)
			if isConditionFailed(err) {
				return nil // another node was faster
			}
			if err != nil {
				return fmt.Errorf("dynamodb: take lease of partition %d: %w", p, err)
			}
			epoch, ok := getN(out.Attributes, attrEpoch)
			if !ok {
				return fmt.Errorf("dynamodb: take lease of partition %d: no epoch returned", p)
			}
			mu.Lock()
			taken = append(taken, outbox.Lease{Partition: p, Epoch: epoch})
			mu.Unlock()
			return nil
		})
		if err != nil {
			return nil, err
		}
	}
	return taken, nil
}

// ReleaseLeases clears the owner of each lease node holds with that epoch
// (conditional UpdateItems), so that other nodes can take it at once.
func (s *Store) ReleaseLeases(ctx context.Context, node string, leases []outbox.Lease) error {
	return parallel(ctx, len(leases), s.opts.Concurrency, func(ctx context.Context, i int) error {
		return s.release(ctx, node, leases[i].Partition, &leases[i].Epoch)
	})
}

// release clears the owner of partition p if node holds it (with epoch, if
// not nil).
func (s *Store) release(ctx context.Context, node string, p int, epoch *int64) error {
	cond := "#owner = :me"
	names := map[string]string{"#owner": attrOwner, "#exp": attrLeaseExpiry}
	values := map[string]types.AttributeValue{":me": str(node), ":zero": num(0)}
	if epoch != nil {
		cond += " AND #epoch = :epoch"
		names["#epoch"] = attrEpoch
		values[":epoch"] = num(*epoch)
	}
	_, err := s.client.UpdateItem(ctx, &dynamodb.UpdateItemInput{
		TableName:                 s.table,
		Key:                       keyOf(leaseKey(p)),
		UpdateExpression:          aws.String("SET #exp = :zero REMOVE #owner"),
		ConditionExpression:       aws.String(cond),
		ExpressionAttributeNames:  names,
		ExpressionAttributeValues: values,
		ReturnConsumedCapacity:    types.ReturnConsumedCapacityTotal,
	}, s.callOpts...)
	if err != nil && !isConditionFailed(err) {
		return fmt.Errorf("dynamodb: release lease of partition %d: %w", p, err)
	}
	return nil
}

// Leave removes node's heartbeat entry and releases the leases node still
// holds with those epochs (conditional writes, as ReleaseLeases).
func (s *Store) Leave(ctx context.Context, node string, leases []outbox.Lease) error {
	_, err := s.client.UpdateItem(ctx, &dynamodb.UpdateItemInput{
		TableName:                s.table,
		Key:                      keyOf(nodesKey),
		UpdateExpression:         aws.String("REMOVE #nodes.#n"),
		ConditionExpression:      aws.String("attribute_exists(#nodes)"),
		ExpressionAttributeNames: map[string]string{"#nodes": attrNodes, "#n": node},
		ReturnConsumedCapacity:   types.ReturnConsumedCapacityTotal,
	}, s.callOpts...)
	if err != nil && !isConditionFailed(err) {
		return fmt.Errorf("dynamodb: remove heartbeat of %s: %w", node, err)
	}
	return s.ReleaseLeases(ctx, node, leases)
}
