// Package brokertest holds what every publisher of the outbox, and the relay
// built on them, is tested with:
//
//   - [Run], the publisher conformance suite, driven through a [Harness] that
//     a broker package provides for its real broker;
//   - [Chaos], a publisher wrapper that fails messages before they reach the
//     broker, loses acknowledgements after they did, and adds latency;
//   - [Checker], which verifies from the writes and the deliveries that
//     nothing was lost, that each key's messages were first delivered in
//     commit order, and counts duplicates.
//
// It imports package testing and is meant for tests only.
package brokertest
