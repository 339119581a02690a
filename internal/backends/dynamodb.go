package backends

import (
	"context"
	"net/url"

	"github.com/outboxrelay/outbox/store/dynamodb"
)

// DynamoDB store: dynamodb://TABLE?endpoint=http://127.0.0.1:8000&region=us-east-1&shards=20
// (see dynamodb.ParseURL for every parameter). The outbox's own parameters
// map as follows: partitions is the shard count (same as shards; default
// dynamodb.ShardsDefault, 20), prefix is put before the table name,
// retention and max_payload as for every store; schema does not apply.
func init() { RegisterStore("dynamodb", openDynamoDB) }

func openDynamoDB(ctx context.Context, u *url.URL, o StoreOptions) (Store, error) {
	opts, err := dynamodb.ParseURL(u.String())
	if err != nil {
		return nil, Invalid(StoreFlag, "%v", err)
	}
	if o.Schema != "" {
		return nil, Invalid("--schema", "does not apply to DynamoDB (a table holds the whole outbox); remove it and name the table in the URL: dynamodb://TABLE")
	}
	if o.Partitions != 0 {
		if opts.Shards != 0 && opts.Shards != o.Partitions {
			return nil, Invalid(StoreFlag, "shards=%d conflicts with partitions %d; give one of them", opts.Shards, o.Partitions)
		}
		opts.Shards = o.Partitions
	}
	if o.Retention != 0 {
		if opts.Retention != 0 && opts.Retention != o.Retention {
			return nil, Invalid(StoreFlag, "retention %v conflicts with %v; give one of them", opts.Retention, o.Retention)
		}
		opts.Retention = o.Retention
	}
	if o.MaxPayload != 0 {
		if opts.MaxPayload != 0 && opts.MaxPayload != o.MaxPayload {
			return nil, Invalid(StoreFlag, "max_payload %d conflicts with %d; give one of them", opts.MaxPayload, o.MaxPayload)
		}
		opts.MaxPayload = o.MaxPayload
	}
	opts.Table = o.TablePrefix + opts.Table
	if err := opts.WithDefaults().Validate(); err != nil {
		return nil, Invalid(StoreFlag, "%v", err)
	}
	return dynamodb.New(ctx, opts)
}
