// Package kafka publishes outbox messages to Apache Kafka through franz-go
// (github.com/twmb/franz-go/pkg/kgo).
//
//	p, err := kafka.Dial(ctx, kafka.Options{Brokers: []string{"localhost:9092"}})
//
// # Guarantees
//
//   - A nil result means the record was acknowledged with acks=all: every
//     in-sync replica has it.
//   - Per-key order. The record key is the message key, so the messages of
//     a key go to one partition; the idempotent producer (franz-go's
//     default) keeps a partition's records in order and drops the
//     duplicates its own retries could create. The Publisher declares
//     outbox.KeyPipeliner: the relay may put up to Options.KeyPipeline
//     messages of a key in one batch (default 8), and Publish produces
//     each once the one before it is acknowledged, none after one that
//     failed; the relay waits for a batch's messages of a key to be
//     acknowledged before publishing the key's next ones, so order holds
//     across batches too. (Why each waits for the one before it, rather
//     than all going at once: see pipeline.go.)
//   - A missing topic blocks that topic (outbox.Blocked: the relay pauses
//     it, spends no attempt and dead-letters nothing until the topic
//     exists), with an error naming it, found at once with a metadata
//     request (cached) instead of after franz-go's retries, unless
//     Options.AllowAutoTopicCreation is set. So do an authorization
//     failure and brokers that do not acknowledge in time; only a message
//     that can never be produced (too large, invalid) fails permanently.
//   - Bounded: the client holds at most Options.MaxBufferedRecords records;
//     a record fails after Options.DeliveryTimeout in the client; a Publish
//     call ends when its context does (or after Options.PublishTimeout
//     without a deadline).
//
// Every record carries the message ID in the Outbox-Id header: Kafka has no
// message ID of its own, and consumers use it to drop the duplicates that
// at-least-once delivery allows (a record re-published after a lost
// acknowledgement).
package kafka
