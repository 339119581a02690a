// Package sqs publishes outbox messages to Amazon SQS queues, standard and
// FIFO, through the AWS SDK for Go v2.
//
//	p, err := sqs.Dial(ctx, sqs.Options{Region: "eu-west-1", FIFO: true})
//
// # Guarantees
//
//   - A nil result means SQS stored the message (or, on a FIFO queue,
//     dropped it as a copy of one it stored within 5 minutes).
//   - Per-key order on FIFO queues: MessageGroupId is the key (GroupID),
//     and the relay passes one message per key per call and the next only
//     after the previous was acknowledged, so a group's messages are
//     stored, and delivered, in commit order; keys are independent groups,
//     consumed in parallel. Standard queues keep no order (SQS's
//     best-effort ordering): use them where order does not matter.
//   - De-duplication on FIFO queues: MessageDeduplicationId is the outbox
//     ID, so a message published again within SQS's 5-minute window (after
//     a lost answer, a relay crash) is dropped by the queue. Standard
//     queues store copies; consumers drop them by the Outbox-Id attribute.
//   - A missing queue blocks its topic (outbox.Blocked: the relay pauses
//     it, spends no attempt and dead-letters nothing until it exists), and
//     so do access denied (IAM, KMS), refused credentials, throttling, SQS
//     unavailable or unreachable, and an answer that did not come before
//     the deadline. Only a message that can never be sent (over
//     MaxMessageBytes, a key SQS cannot carry, an entry SQS refuses as
//     invalid) fails permanently.
//   - Bounded: 10 entries and MaxMessageBytes per request,
//     MaxConcurrentRequests requests per Publish call, PublishTimeout.
//
// Headers travel as message attributes (at most 10 per message, the
// publisher's included): see Publisher for the rule that packs them into
// one JSON attribute when they do not fit.
package sqs
