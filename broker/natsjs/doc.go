// Package natsjs is the NATS JetStream publisher of the outbox relay.
//
// # Guarantees
//
//   - A nil result means JetStream stored the message; an error wrapping
//     outbox.ErrDuplicate means it had already stored a message with the
//     same ID within the stream's Duplicates window. Either way the relay
//     may delete it from the outbox (and it reports the duplicate).
//   - A publish made while the connection is down fails at once, for
//     certain (Dial sets nats.ReconnectBufSize(-1)): it is never sent
//     later from a reconnect buffer while reported failed.
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
// covers fails with an error blocking the topic (outbox.Blocked: the relay
// pauses the topic and dead-letters nothing until a stream covers it),
// naming the subject. Create the streams first,
// with subjects matching SubjectPrefix+topic, file storage, and a Duplicates
// window longer than the relay's retry backoff if duplicates matter.
package natsjs
