// Package console is the outbox web console: a few server-rendered pages
// (html/template) to watch an outbox and fix what is stuck, served by
// `outbox console --store URL` (the store alone) and `outbox relay
// --console` (beside /metrics, with the relay's live state).
//
// # Pages
//
//   - / (overview): outstanding messages and the oldest age, per topic;
//     dead letters; live relays with their partitions; the relay of this
//     process (throughput, leases, blocked destinations) when there is one;
//     backlog and throughput charts (inline SVG) that refresh without
//     reloading the page (console.js fetches /overview/live every few
//     seconds; /api/overview is the same data as JSON).
//   - /partitions: backlog, owner, epoch and lease expiry per partition; a
//     hot partition stands out.
//   - /dead-letters: filters (topic, key, error text, age), paging, and
//     requeue or purge of one, a selection, or everything matching, each
//     behind a confirmation page that says how many messages it touches;
//     /dead-letters/{id}: one dead letter with its payload (pretty JSON, or
//     a hex dump), headers, attempts and last error.
//   - /find?q=: a message by ID or key: outstanding, dead, published and
//     still kept, or unknown.
//
// What a store cannot answer (no [outbox.AdminStore], a state it cannot
// search by key) is shown as such.
//
// # Data sources
//
// The store answers everything it holds, through [outbox.AdminStore]
// (status, dead letters, find). What only a running
// relay knows (its throughput, the leases it holds, the destinations it
// has blocked) comes from a [Live] source: [RelayLive] adapts an
// *outbox.Relay, and a Live that also implements [BlockedReporter] lists
// blocked destinations. Without a Live source (`outbox console`) the pages
// say that the store does not know about blocked destinations or
// throughput.
//
// The overview reads the store's status at most every RefreshMin, and
// never sooner than five times the last read took after it, so that
// watching a large outbox costs the database at most a fifth of one
// connection's time; every viewer is served from that snapshot.
//
// # Safety
//
//   - Without authentication the console answers only loopback clients
//     addressed by a loopback host name (no DNS rebinding); the CLI refuses
//     to listen beyond loopback without --basic-auth-file or --token-file.
//   - Actions are POST forms carrying a CSRF token tied to the user, checked
//     together with the browser's Sec-Fetch-Site/Origin headers
//     (net/http.CrossOriginProtection). ReadOnly renders no action and
//     refuses every POST. Each action is logged with the user who did it.
//   - html/template escapes every value; payloads, headers, keys and errors
//     come from applications and render as text. A Content-Security-Policy
//     allows only the console's own script and style.
//   - Every store call is bounded by a timeout and every listing by a limit.
package console
