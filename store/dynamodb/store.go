package dynamodb

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"slices"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/outboxrelay/outbox"
)

// Store is an outbox in one DynamoDB table. It implements [outbox.Store]
// and [outbox.AdminStore] (status and dead letters), and offers the ADR's
// operations (Outstanding, Dispatched, GetMany, MarkDispatched, Delete,
// OutstandingCount) to applications that dispatch on their own.
//
// A Store is safe for concurrent use. Its methods make the requests they
// need and do not retry failed ones (the relay, or the caller, does), with
// one exception: batch requests are resent, with backoff, for the keys or
// items DynamoDB returns as unprocessed.
type Store struct {
	client    *dynamodb.Client
	opts      Options
	table     *string
	callOpts  []func(*dynamodb.Options)
	stats     stats
	seq       seqGen
	transport *http.Transport // ours to close, or nil
}

// ErrDuplicateID is returned by Write when an item with the message's ID
// exists already.
var ErrDuplicateID = errors.New("dynamodb: a message with this ID exists already")

// MissingError is returned by GetMany when DynamoDB returns only a subset
// of the requested messages.
type MissingError struct {
	// IDs are the requested IDs that were not found.
	IDs []string
}

func (e *MissingError) Error() string {
	return fmt.Sprintf("dynamodb: %d requested message(s) not found, such as %s", len(e.IDs), e.IDs[0])
}

// New returns a Store for opts (defaults applied, then validated). It
// makes no request: create the table with Migrate, or by infrastructure as
// code (README.md). Call Close when done.
func New(ctx context.Context, opts Options) (*Store, error) {
	opts = opts.WithDefaults()
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	s := &Store{opts: opts, table: aws.String(opts.Table)}
	s.callOpts = []func(*dynamodb.Options){func(o *dynamodb.Options) {
		o.APIOptions = append(o.APIOptions, s.statsMiddleware)
	}}
	if opts.Client != nil {
		s.client = opts.Client
		return s, nil
	}
	httpClient := awshttp.NewBuildableClient().WithTransportOptions(func(tr *http.Transport) {
		tr.MaxIdleConns = 2 * ConcurrencyMax
		tr.MaxIdleConnsPerHost = ConcurrencyMax
	})
	loadOpts := []func(*config.LoadOptions) error{
		config.WithHTTPClient(httpClient),
		// Stores do not retry; the relay (or the caller) does.
		config.WithRetryer(func() aws.Retryer { return aws.NopRetryer{} }),
	}
	if opts.Region != "" {
		loadOpts = append(loadOpts, config.WithRegion(opts.Region))
	}
	if opts.Endpoint != "" && os.Getenv("AWS_ACCESS_KEY_ID") == "" {
		loadOpts = append(loadOpts, config.WithCredentialsProvider(credentials.NewStaticCredentialsProvider("outbox", "outbox", "")))
	}
	cfg, err := config.LoadDefaultConfig(ctx, loadOpts...)
	if err != nil {
		s.Close()
		return nil, fmt.Errorf("dynamodb: load AWS configuration: %w", err)
	}
	if opts.HTTPClient != nil {
		// Set after loading: the loader would try to configure its TLS
		// (AWS_CA_BUNDLE), which only its own client type supports.
		cfg.HTTPClient = opts.HTTPClient
	} else if bc, ok := cfg.HTTPClient.(*awshttp.BuildableClient); ok {
		// The configured transport (with AWS_CA_BUNDLE and friends
		// applied), in a client of ours so that Close can close its idle
		// connections.
		s.transport = bc.GetTransport()
		cfg.HTTPClient = &http.Client{Transport: s.transport}
	}
	if cfg.Region == "" {
		s.Close()
		return nil, errors.New("dynamodb: no AWS region: set Options.Region, ?region= in the URL, or AWS_REGION")
	}
	s.client = dynamodb.NewFromConfig(cfg, func(o *dynamodb.Options) {
		if opts.Endpoint != "" {
			o.BaseEndpoint = aws.String(opts.Endpoint)
		}
	})
	return s, nil
}

// Open returns a Store for a URL of the form
//
//	dynamodb://TABLE?endpoint=http://127.0.0.1:8000&region=us-east-1&shards=20
//
// (see ParseURL for every parameter).
func Open(ctx context.Context, rawURL string) (*Store, error) {
	opts, err := ParseURL(rawURL)
	if err != nil {
		return nil, err
	}
	return New(ctx, opts)
}

// Close releases the idle connections of the HTTP client the store built.
// The store must not be used afterwards.
func (s *Store) Close() error {
	if s.transport != nil {
		s.transport.CloseIdleConnections()
	}
	return nil
}

// Options returns the store's options, defaults applied.
func (s *Store) Options() Options { return s.opts }

// Client returns the DynamoDB client, for the caller's own
// TransactWriteItems (see TransactWriteItem). Pass CallOptions() to count
// those requests in Stats.
func (s *Store) Client() *dynamodb.Client { return s.client }

// CallOptions returns the per-call options that count a request in Stats.
func (s *Store) CallOptions() []func(*dynamodb.Options) { return slices.Clone(s.callOpts) }

// Write stores msg in the outbox with a conditional PutItem
// (attribute_not_exists(MessageId)), outside any transaction. It fills in
// an empty ID and CreatedAt, validates the message (errors are
// *outbox.ValidationError), assigns its shard (outbox.PartitionOf(Key,
// Shards)) and Seq. An existing ID gives ErrDuplicateID. To write atomically
// with business data, use TransactWriteItem instead.
func (s *Store) Write(ctx context.Context, msg *outbox.Message) error {
	item, err := s.newItem(ctx, msg)
	if err != nil {
		return err
	}
	_, err = s.client.PutItem(ctx, &dynamodb.PutItemInput{
		TableName:                s.table,
		Item:                     item,
		ConditionExpression:      aws.String(condNewMessage),
		ExpressionAttributeNames: map[string]string{"#id": attrID},
		ReturnConsumedCapacity:   types.ReturnConsumedCapacityTotal,
	}, s.callOpts...)
	if isConditionFailed(err) {
		return fmt.Errorf("dynamodb: write %s: %w", msg.ID, ErrDuplicateID)
	}
	if err != nil {
		return fmt.Errorf("dynamodb: write %s: %w", msg.ID, err)
	}
	return nil
}

const condNewMessage = "attribute_not_exists(#id)"

// TransactWriteItem prepares msg as Write does and returns the Put for the
// caller's own TransactWriteItems request, next to its business writes:
//
//	put, err := store.TransactWriteItem(&msg)
//	…
//	_, err = client.TransactWriteItems(ctx, &dynamodb.TransactWriteItemsInput{
//		TransactItems: []types.TransactWriteItem{orderPut, put},
//	})
//
// The message exists if and only if the transaction succeeds. The Put has
// the same condition as Write (attribute_not_exists(MessageId)); a
// TransactionCanceledException whose reason for this item is
// ConditionalCheckFailed means a duplicate ID. The item's Seq is taken when
// TransactWriteItem is called, so build it just before sending. A
// transaction holds at most 100 items.
func (s *Store) TransactWriteItem(msg *outbox.Message) (types.TransactWriteItem, error) {
	return s.TransactWriteItemContext(context.Background(), msg)
}

// TransactWriteItemContext is TransactWriteItem for a write made in ctx:
// with Options.Inject, msg's headers get what ctx carries for consumers
// (the trace context of the writing span), as with Write.
func (s *Store) TransactWriteItemContext(ctx context.Context, msg *outbox.Message) (types.TransactWriteItem, error) {
	item, err := s.newItem(ctx, msg)
	if err != nil {
		return types.TransactWriteItem{}, err
	}
	return types.TransactWriteItem{Put: &types.Put{
		TableName:                s.table,
		Item:                     item,
		ConditionExpression:      aws.String(condNewMessage),
		ExpressionAttributeNames: map[string]string{"#id": attrID},
	}}, nil
}

// GetMany returns the messages with the given IDs, in that order, with
// consistent BatchGetItem reads (100 keys a request, requests run
// concurrently; unprocessed keys are resent with backoff). If some are not
// found it returns the others and a *MissingError naming the missing IDs,
// as the ADR requires ("an error when a subset comes back").
func (s *Store) GetMany(ctx context.Context, ids []string) ([]outbox.Record, error) {
	for _, id := range ids {
		if err := outbox.ValidateID(id); err != nil {
			return nil, fmt.Errorf("dynamodb: GetMany: ID %w", err)
		}
	}
	items, err := s.batchGet(ctx, ids, true, nil)
	if err != nil {
		return nil, err
	}
	recs := make([]outbox.Record, 0, len(ids))
	var missing []string
	for _, id := range ids {
		item, ok := items[id]
		if !ok {
			missing = append(missing, id)
			continue
		}
		r, err := recordOf(item)
		if err != nil {
			return nil, err
		}
		recs = append(recs, r)
	}
	if len(missing) > 0 {
		return recs, &MissingError{IDs: missing}
	}
	return recs, nil
}

// MarkDispatched records that the message was delivered at `at` with one
// UpdateItem (SET DeliveryTime REMOVE OutstandingCreatedTime,
// OutstandingSeq; no read-modify-write): the message leaves the
// outstanding indexes and enters the delivered ones. With Retention it
// also sets ExpiresAt for TTL. A missing message is an error wrapping
// ErrNotFound.
func (s *Store) MarkDispatched(ctx context.Context, id string, at time.Time) error {
	if err := outbox.ValidateID(id); err != nil {
		return fmt.Errorf("dynamodb: MarkDispatched: ID %w", err)
	}
	err := s.markDispatched(ctx, id, at)
	if isConditionFailed(err) {
		return fmt.Errorf("dynamodb: mark %s dispatched: %w", id, ErrNotFound)
	}
	return err
}

// ErrNotFound reports a message that is not in the outbox.
var ErrNotFound = errors.New("dynamodb: message not found")

func (s *Store) markDispatched(ctx context.Context, id string, at time.Time) error {
	update := "SET #dt = :t REMOVE #oct, #oseq"
	values := map[string]types.AttributeValue{":t": micros(at)}
	names := map[string]string{"#id": attrID, "#dt": attrDeliveryTime, "#oct": attrOutstandingCreatedTime, "#oseq": attrOutstandingSeq}
	if s.opts.Retention > 0 {
		update = "SET #dt = :t, #exp = :exp REMOVE #oct, #oseq"
		values[":exp"] = num(at.Add(s.opts.Retention).Unix())
		names["#exp"] = attrExpiresAt
	}
	_, err := s.client.UpdateItem(ctx, &dynamodb.UpdateItemInput{
		TableName:                 s.table,
		Key:                       keyOf(id),
		UpdateExpression:          aws.String(update),
		ConditionExpression:       aws.String("attribute_exists(#id)"),
		ExpressionAttributeNames:  names,
		ExpressionAttributeValues: values,
		ReturnConsumedCapacity:    types.ReturnConsumedCapacityTotal,
	}, s.callOpts...)
	if err != nil && !isConditionFailed(err) {
		return fmt.Errorf("dynamodb: mark %s dispatched: %w", id, err)
	}
	return err
}

// Delete deletes the messages with BatchWriteItem (25 a request, requests
// run concurrently; unprocessed items are resent with backoff). Deleting a
// missing message is not an error. If some deletes still fail after
// Options.UnprocessedAttempts sends, it returns an error naming how many.
func (s *Store) Delete(ctx context.Context, ids []string) error {
	for _, id := range ids {
		if err := outbox.ValidateID(id); err != nil {
			return fmt.Errorf("dynamodb: Delete: ID %w", err)
		}
	}
	return s.batchDelete(ctx, ids)
}

// OutstandingCount counts the outstanding messages (written, neither
// delivered nor dead-lettered) with a Scan of the OutstandingAllTopics index
// with Select=COUNT. With Options.MaxOutstanding the page size is
// MaxOutstanding+1 and the count stops as soon as it exceeds
// MaxOutstanding (so a result above MaxOutstanding means "full", not the
// exact backlog); otherwise pages of CountPageSizeDefault are counted to
// the end.
func (s *Store) OutstandingCount(ctx context.Context) (int64, error) {
	page := int32(CountPageSizeDefault)
	if s.opts.MaxOutstanding > 0 {
		page = int32(min(s.opts.MaxOutstanding+1, 1<<30))
	}
	var total int64
	var start map[string]types.AttributeValue
	for {
		out, err := s.client.Scan(ctx, &dynamodb.ScanInput{
			TableName:              s.table,
			IndexName:              aws.String(s.opts.Indexes.OutstandingAllTopics),
			Select:                 types.SelectCount,
			Limit:                  aws.Int32(page),
			ExclusiveStartKey:      start,
			ReturnConsumedCapacity: types.ReturnConsumedCapacityTotal,
		}, s.callOpts...)
		if err != nil {
			return 0, fmt.Errorf("dynamodb: count outstanding: %w", err)
		}
		total += int64(out.Count)
		if len(out.LastEvaluatedKey) == 0 || (s.opts.MaxOutstanding > 0 && total > int64(s.opts.MaxOutstanding)) {
			return total, nil
		}
		start = out.LastEvaluatedKey
	}
}
