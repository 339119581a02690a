// Package redis publishes outbox messages to Redis Streams through go-redis
// (github.com/redis/go-redis/v9): one XADD per message, to a stream per
// topic.
//
//	p, err := redis.Dial(ctx, redis.Options{Addr: "127.0.0.1:6379"})
//
// # Guarantees
//
//   - A nil result means the server added the entry and answered. How
//     durable that is depends on the server: with appendonly yes and
//     appendfsync always the entry is on disk; with the defaults (RDB
//     snapshots, or appendfsync everysec) a crash of the server can lose
//     up to a second or more of acknowledged entries, and a failover can
//     lose what the replicas had not copied. Configure the server for the
//     durability you need.
//   - Per-key order. A batch is one pipeline on one connection, whose
//     XADDs Redis runs in order, and the relay passes one message per key
//     per call and the next only after the previous was acknowledged; so a
//     key's entries are added in commit order. Entries of a stream are
//     read in the order they were added.
//   - No de-duplication by the server: a message published again (after a
//     lost reply or a crash) is a second entry with the same outbox.id
//     field, which consumers use to drop it.
//   - A missing stream blocks its topic (outbox.Blocked: the relay pauses
//     it, spends no attempt and dead-letters nothing until it exists),
//     unless Options.CreateStreams; so do a key of another type, a user
//     without the right to XADD it (ACL), a server out of memory, read-only
//     or loading, an unreachable server and a reply that did not come
//     before the deadline. Only a message that can never be added (over
//     MaxMessageBytes, no ID) fails permanently.
//   - Bounded: at most PoolSize connections; a Publish call ends when its
//     context does (or after PublishTimeout without a deadline); streams
//     can be trimmed with MAXLEN ~ (Options.MaxLen).
//
// TLS (rediss://, Options.TLS) and ACL users (Options.Username and
// Password) are supported; the user needs +xadd on the streams' keys and
// +ping.
package redis
