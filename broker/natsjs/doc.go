// Package natsjs is the NATS JetStream publisher of the outbox relay.
//
// # Guarantees
//
//   - A nil result means JetStream stored the message (or had already stored
//     a message with the same ID within the stream's Duplicates window): the
//     relay may then delete it from the outbox.
//   - Every copy carries the message ID in Nats-Msg-Id, so JetStream drops a
//     copy re-published after a lost acknowledgement (within the
//     Duplicates window) and consumers can drop later ones.
//   - Publish never retries and never waits past its context; retrying,
//     backoff and dead-lettering are the relay's.
//   - At most MaxInFlight messages are awaited at once, across all calls.
//
// # Streams
//
// The publisher does not create streams: publishing to a subject no stream
// covers fails permanently, naming the subject. Create the streams first,
// with subjects matching SubjectPrefix+topic, file storage, and a Duplicates
// window longer than the relay's retry backoff if duplicates matter.
package natsjs
