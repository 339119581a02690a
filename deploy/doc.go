// Package deploy holds no code: it is the home of the files operators
// deploy next to the relay, and of their tests.
//
//   - prometheus/alerts.yml: alerting rules (growing backlog, old messages,
//     dead letters, no live relay, lease churn, blocked destinations,
//     unreachable broker or store), with unit tests in
//     prometheus/alerts_test.yml run by `promtool test rules`.
//   - grafana/outbox.json: a Grafana dashboard of the relay's metrics.
//
// The tests need promtool (Debian's prometheus package; scripts/test.sh
// installs it). The metric names both files use are checked against a
// running relay's /metrics by internal/cli's TestRelayThroughBrokerOutage.
package deploy
