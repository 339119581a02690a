package dynamodb

import (
	"context"
	"maps"
	"sync"
	"time"

	awsmiddleware "github.com/aws/aws-sdk-go-v2/aws/middleware"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/aws/smithy-go/middleware"
)

// OpStats counts the requests of one DynamoDB operation.
type OpStats struct {
	// Requests counts the calls sent (each resend of a batch's unprocessed
	// part is a request of its own).
	Requests int64 `json:"requests"`
	// Errors counts the calls that failed, conditional-check failures
	// included.
	Errors int64 `json:"errors"`
	// ConsumedCapacity adds up the capacity units DynamoDB reported
	// (ReturnConsumedCapacity TOTAL on every request the store makes).
	ConsumedCapacity float64 `json:"consumed_capacity"`
}

// RequestEvent is what Options.OnRequest receives after every request.
type RequestEvent struct {
	// Operation is the DynamoDB operation: "Query", "BatchGetItem", ...
	Operation        string
	ConsumedCapacity float64
	Duration         time.Duration
	Err              error
}

// RequestCount is the number of requests and capacity units one piece of
// work cost.
type RequestCount struct {
	Requests         int64   `json:"requests"`
	ConsumedCapacity float64 `json:"consumed_capacity"`
}

// stats holds the per-operation counters of a Store.
type stats struct {
	mu  sync.Mutex
	ops map[string]OpStats
}

func (st *stats) add(op string, capacity float64, err error) {
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.ops == nil {
		st.ops = make(map[string]OpStats)
	}
	o := st.ops[op]
	o.Requests++
	o.ConsumedCapacity += capacity
	if err != nil {
		o.Errors++
	}
	st.ops[op] = o
}

// Stats returns the requests made so far by this store, per DynamoDB
// operation (a snapshot; safe for concurrent use). The relay's Hook and a
// metrics exporter can poll it, or use Options.OnRequest for each request.
func (s *Store) Stats() map[string]OpStats {
	s.stats.mu.Lock()
	defer s.stats.mu.Unlock()
	return maps.Clone(s.stats.ops)
}

// TotalRequests adds up Stats over every operation.
func (s *Store) TotalRequests() RequestCount {
	var c RequestCount
	for _, o := range s.Stats() {
		c.Requests += o.Requests
		c.ConsumedCapacity += o.ConsumedCapacity
	}
	return c
}

// counterKey is the context key of a *requestCounter: requests made with
// such a context are also counted there, whatever other goroutines of the
// store do meanwhile.
type counterKey struct{}

type requestCounter struct {
	mu sync.Mutex
	c  RequestCount
}

// countRequests returns a context whose requests are counted by the
// returned function's result.
func countRequests(ctx context.Context) (context.Context, func() RequestCount) {
	rc := &requestCounter{}
	return context.WithValue(ctx, counterKey{}, rc), func() RequestCount {
		rc.mu.Lock()
		defer rc.mu.Unlock()
		return rc.c
	}
}

// statsMiddleware counts every call made with the store's call options.
func (s *Store) statsMiddleware(stack *middleware.Stack) error {
	return stack.Initialize.Add(middleware.InitializeMiddlewareFunc("OutboxRequestStats",
		func(ctx context.Context, in middleware.InitializeInput, next middleware.InitializeHandler) (middleware.InitializeOutput, middleware.Metadata, error) {
			start := time.Now()
			out, md, err := next.HandleInitialize(ctx, in)
			op := awsmiddleware.GetOperationName(ctx)
			capacity := consumedCapacity(out.Result)
			s.stats.add(op, capacity, err)
			if rc, ok := ctx.Value(counterKey{}).(*requestCounter); ok {
				rc.mu.Lock()
				rc.c.Requests++
				rc.c.ConsumedCapacity += capacity
				rc.mu.Unlock()
			}
			if s.opts.OnRequest != nil {
				s.opts.OnRequest(RequestEvent{Operation: op, ConsumedCapacity: capacity, Duration: time.Since(start), Err: err})
			}
			return out, md, err
		}), middleware.After)
}

// consumedCapacity extracts the capacity units from an operation's output.
func consumedCapacity(result any) float64 {
	one := func(c *types.ConsumedCapacity) float64 {
		if c == nil || c.CapacityUnits == nil {
			return 0
		}
		return *c.CapacityUnits
	}
	many := func(cs []types.ConsumedCapacity) float64 {
		t := 0.0
		for i := range cs {
			t += one(&cs[i])
		}
		return t
	}
	switch r := result.(type) {
	case *dynamodb.PutItemOutput:
		return one(r.ConsumedCapacity)
	case *dynamodb.UpdateItemOutput:
		return one(r.ConsumedCapacity)
	case *dynamodb.DeleteItemOutput:
		return one(r.ConsumedCapacity)
	case *dynamodb.GetItemOutput:
		return one(r.ConsumedCapacity)
	case *dynamodb.QueryOutput:
		return one(r.ConsumedCapacity)
	case *dynamodb.ScanOutput:
		return one(r.ConsumedCapacity)
	case *dynamodb.BatchGetItemOutput:
		return many(r.ConsumedCapacity)
	case *dynamodb.BatchWriteItemOutput:
		return many(r.ConsumedCapacity)
	case *dynamodb.TransactWriteItemsOutput:
		return many(r.ConsumedCapacity)
	}
	return 0
}
