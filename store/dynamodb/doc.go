// Package dynamodb is an outbox in one DynamoDB table, designed after
// Brighter's ADR 0034 ("Optimise reads/writes from/to Dynamo outbox"), with
// the relay's partition leases held by conditional writes in the same
// table. README.md in this directory documents the table, its indexes and
// items for infrastructure as code, the cost of each operation, and how to
// migrate a table of the older layout.
//
// # Writing
//
// An application writes a message atomically with its own data by adding
// [Store.TransactWriteItem]'s item to its TransactWriteItems request:
//
//	put, err := store.TransactWriteItem(&outbox.Message{Topic: "orders.created", Key: orderID, Payload: body})
//	if err != nil { … } // *outbox.ValidationError names the field
//	_, err = client.TransactWriteItems(ctx, &dynamodb.TransactWriteItemsInput{
//		TransactItems: []types.TransactWriteItem{orderPut, put},
//	})
//
// [Store.Write] stores one message on its own with a conditional PutItem.
// Both assign the shard, outbox.PartitionOf(Key, Shards): the first 4
// bytes of SHA-256(key) as a little-endian uint32, modulo the shard count
// (the ADR's formula), or a random shard for a message without a key.
//
// # Reading as the ADR does
//
// [Store.Outstanding] and [Store.Dispatched] list messages of one topic (a
// Query per shard of the sharded Outstanding or Delivered index, merged in
// time order) or of every topic (a parallel Scan of the sparse
// OutstandingAllTopics or DeliveredAllTopics index in ScanConcurrency
// segments, sorted in memory). [Store.GetMany] reads messages with
// BatchGetItem and fails when only a subset comes back;
// [Store.MarkDispatched] is one UpdateItem (SET DeliveryTime REMOVE
// OutstandingCreatedTime, never read-modify-write); [Store.Delete] uses
// BatchWriteItem and fails if any delete still fails;
// [Store.OutstandingCount] scans with Select=COUNT and a page size of
// MaxOutstanding+1. Batch requests resend unprocessed keys and items with
// backoff; apart from that the store retries nothing.
//
// # The relay
//
// [Store] implements [outbox.Store] and [outbox.AdminStore] (not
// [outbox.UnorderedStore]: DynamoDB has no row locks). A relay partition is a shard. Guarantees and their limits:
//
//   - Atomic with the business write: with TransactWriteItem, the message
//     exists if and only if the caller's transaction succeeds. (dynalite, used
//     by the tests, has no TransactWriteItems; the tests apply the item with
//     the equivalent PutItem.)
//   - At least once: a message leaves the outstanding indexes only when a
//     relay settles it as delivered, after the broker acknowledged it.
//   - Per-key order: messages of a key share a shard and are fetched in Seq
//     order. Seq comes from the writer's clock (README.md), so across
//     writer processes order holds to their clock agreement. The relay's
//     index is eventually consistent and not updated in write order, so
//     Fetch returns only messages written at least Options.FetchDelay (1 s)
//     ago, by when earlier ones are visible too; it re-reads every hit with
//     a consistent BatchGetItem and drops messages already settled, so a
//     relay never publishes twice what it settled; a message the index
//     shows later still is found by Unsettled.
//   - Fencing: leases are items updated with conditions on owner, epoch and
//     expiry. Settle checks the leases with one consistent read just before
//     writing (a condition cannot span items without transactions); the
//     window is milliseconds and harmless as explained on [Store.Settle].
//     Lease and heartbeat expiry use the relays' clocks.
//   - No poison pill: failures and dead letters are per message (Attempts,
//     NextAttemptTime, LastError; DeadLetteredTime).
//   - Bounded: every call runs at most Options.Concurrency requests at once;
//     Fetch reads at most limit entries per shard.
//
// # Costs
//
// Every request is counted per operation, with the capacity DynamoDB
// reports: [Store.Stats], [Options].OnRequest, [Store.DetailedStatus].
// `outbox bench --store dynamodb://…` reproduces the ADR's case (scenario
// dynamodb/outstanding): finding outstanding messages of 5 topics × 20
// shards takes 100 Query requests with the older layout, ScanConcurrency
// with this one.
//
// # Concurrency
//
// A Store is safe for concurrent use by any number of goroutines and
// processes.
package dynamodb
