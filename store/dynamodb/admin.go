package dynamodb

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/outboxrelay/outbox"
)

var _ outbox.AdminStore = (*Store)(nil)

// matchDeadItems keeps the entries whose items match f.Key and
// f.ErrorContains. The DeadLettered index holds neither attribute, so it
// reads them (only them) from the base table with consistent
// BatchGetItems: its cost grows with the dead letters the other filters
// leave.
func (s *Store) matchDeadItems(ctx context.Context, entries []Entry, f outbox.DeadLetterFilter) ([]Entry, error) {
	ids := make([]string, len(entries))
	for i, e := range entries {
		ids[i] = e.ID
	}
	items, err := s.batchGet(ctx, ids, true, &projection{
		expr:  "#id, #k, #err",
		names: map[string]string{"#id": attrID, "#k": attrKey, "#err": attrLastError},
	})
	if err != nil {
		return nil, err
	}
	text := strings.ToLower(f.ErrorContains)
	return slices.DeleteFunc(entries, func(e Entry) bool {
		item, ok := items[e.ID]
		return !ok || (f.Key != "" && getS(item, attrKey) != f.Key) ||
			(text != "" && !strings.Contains(strings.ToLower(getS(item, attrLastError)), text))
	}), nil
}

// CountDeadLetters counts the dead letters matching f (Limit and After
// ignored): a Select=COUNT Scan of the DeadLettered index without filters,
// else what DeadLetters reads before it pages.
func (s *Store) CountDeadLetters(ctx context.Context, f outbox.DeadLetterFilter) (int64, error) {
	if f.Topic == "" && len(f.IDs) == 0 && f.Key == "" && f.ErrorContains == "" && f.FailedBefore.IsZero() && f.FailedAfter.IsZero() {
		return s.countIndex(ctx, s.opts.Indexes.DeadLettered)
	}
	entries, err := s.deadEntries(ctx, f)
	if err != nil {
		return 0, err
	}
	return int64(len(entries)), nil
}

// noKeyIndex is why FindMessages cannot search outstanding and published
// messages by key.
const noKeyIndex = "the DynamoDB table has no index by message key (adding one would cost every write); search by ID"

// FindMessages looks a message up by ID with one consistent GetItem
// (outstanding, dead, or delivered and kept by Retention), or the dead
// letters of a key (as DeadLetters does with DeadLetterFilter.Key).
// Outstanding and published messages cannot be searched by key: the result
// says so in Unsearched.
func (s *Store) FindMessages(ctx context.Context, fq outbox.FindQuery) (*outbox.FindResult, error) {
	limit, err := fq.Check()
	if err != nil {
		return nil, err
	}
	res := &outbox.FindResult{Messages: []outbox.FoundMessage{}}
	if fq.Key != "" {
		dls, err := s.DeadLetters(ctx, outbox.DeadLetterFilter{Key: fq.Key, Limit: limit + 1})
		if err != nil {
			return nil, err
		}
		if len(dls) > limit {
			dls, res.Truncated = dls[:limit], true
		}
		for _, d := range dls {
			m := outbox.FoundMessage{State: outbox.StateDead, FailedAt: d.FailedAt}
			m.Message, m.Attempts, m.LastError = d.Message, d.Attempts, d.LastError
			m.Partition = outbox.PartitionOf(d.Key, s.opts.Shards)
			res.Messages = append(res.Messages, m)
		}
		res.Unsearched = map[outbox.MessageState]string{outbox.StateOutstanding: noKeyIndex, outbox.StatePublished: noKeyIndex}
		return res, nil
	}
	out, err := s.client.GetItem(ctx, &dynamodb.GetItemInput{
		TableName:              s.table,
		Key:                    keyOf(fq.ID),
		ConsistentRead:         aws.Bool(true),
		ReturnConsumedCapacity: types.ReturnConsumedCapacityTotal,
	}, s.callOpts...)
	if err != nil {
		return nil, fmt.Errorf("dynamodb: find %s: %w", fq.ID, err)
	}
	if len(out.Item) == 0 {
		return res, nil
	}
	r, err := recordOf(out.Item)
	if err != nil {
		return nil, err
	}
	m := outbox.FoundMessage{Record: r}
	switch {
	case hasAttr(out.Item, attrDeadLetteredTime):
		m.State, m.FailedAt = outbox.StateDead, getTime(out.Item, attrDeadLetteredTime)
	case hasAttr(out.Item, attrOutstandingSeq):
		m.State = outbox.StateOutstanding
	case hasAttr(out.Item, attrDeliveryTime):
		m.State, m.PublishedAt = outbox.StatePublished, getTime(out.Item, attrDeliveryTime)
	default:
		return res, nil // not a message in any state the outbox knows
	}
	res.Messages = append(res.Messages, m)
	return res, nil
}

func hasAttr(item map[string]types.AttributeValue, name string) bool {
	_, ok := item[name]
	return ok
}
