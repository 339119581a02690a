// Package dynamobench reaches the benchmark helpers of store/dynamodb that
// `outbox bench` needs: they use the store's unexported internals (its
// client, table layout and request counting) but are no part of its public
// API. store/dynamodb registers them here from an init function, so that
// the public package exports nothing for the bench; this package cannot
// import store/dynamodb (that would be a cycle), hence store any: a
// *dynamodb.Store.
package dynamobench

import "context"

// Count is the requests and capacity units a piece of work cost (the
// fields of dynamodb.RequestCount, which converts to and from it).
type Count struct {
	Requests         int64
	ConsumedCapacity float64
}

var (
	// CompareOutstanding finds the outstanding messages of every topic
	// twice and returns what each way cost: older, the older layout's
	// loop (a Query of the Outstanding index per topic and shard, up to
	// PageSize entries each), and ours, Outstanding with no topic (a
	// parallel Scan of OutstandingAllTopics). shards is the shard count
	// the older loop iterates over; 0 means the store's.
	CompareOutstanding func(ctx context.Context, store any, topics []string, shards int) (older, ours Count, err error)
	// FillBacklog writes n small messages spread over topics with
	// BatchWriteItem, 25 a request: a fast way to make a backlog; not the
	// transactional Write.
	FillBacklog func(ctx context.Context, store any, topics []string, n int) error
)
