// Package kinesis publishes outbox messages to Amazon Kinesis Data Streams
// through the AWS SDK for Go v2: PutRecords, with the message key as the
// partition key.
//
//	p, err := kinesis.Dial(ctx, kinesis.Options{Region: "eu-west-1"})
//
// # Guarantees
//
//   - A nil result means Kinesis stored the record (PutRecords answered it
//     with a sequence number).
//   - Per-key order. The partition key is the message key, so a key's
//     records go to one shard, which keeps them in the order Kinesis
//     accepted them. PutRecords does not stop at a failed record: a later
//     record of the same key in the same request could be stored before
//     the failed one is retried. So a key's next record is sent only after
//     the previous one succeeded: the relay passes one message per key per
//     call and the next only after the previous was acknowledged, and
//     within one Publish call (a caller other than the relay may pass
//     several messages of a key) a key's later messages go in later
//     requests, sent only once the earlier ones succeeded; when one fails,
//     its key's later messages in the call are not sent and fail with a
//     retryable error. A failed record (throughput exceeded, an internal
//     failure) is therefore retried by the relay before anything after it
//     of its key. For this reason the Publisher is not an
//     outbox.KeyPipeliner.
//   - No de-duplication by Kinesis: a record published again (after a lost
//     answer, a relay crash) is stored twice, with the same outbox ID in
//     its envelope, which consumers use to drop it.
//   - A missing stream (or one being created, deleted or resharded) blocks
//     its topic (outbox.Blocked: the relay pauses it, spends no attempt and
//     dead-letters nothing until it works), and so do access denied (IAM,
//     KMS), refused credentials, throttling (a shard's or the account's
//     throughput exceeded), Kinesis unavailable or unreachable, and a
//     connection closed before the answer. A message that can never be
//     sent (its record over MaxRecordBytes, no ID, a topic mapped to an
//     invalid stream name) fails permanently. Anything else (an internal
//     failure of a record, no answer before the deadline) is retryable.
//   - Bounded: MaxBatchRecords records and 5 MiB per request,
//     MaxRecordBytes per record, MaxConcurrentRequests requests per
//     Publish call, PublishTimeout.
//
// # The record
//
// A Kinesis record has only data and a partition key, so the data is an
// envelope: one line of JSON with the message's fields, a newline, and the
// payload's bytes as they are (see [Envelope], [Encode] and [Decode]):
//
//	{"outbox":1,"id":"0193…","topic":"orders.created","key":"order-7","created_at":"2026-…Z","headers":{"traceparent":"00-…"}}\n<payload>
//
// The headers carry what the relay's tracing and the stores' header
// injectors put there (the W3C trace context: traceparent, tracestate).
package kinesis
