package bench

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/url"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	awsdynamodb "github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"golang.org/x/sync/errgroup"

	"github.com/outboxrelay/outbox"
	"github.com/outboxrelay/outbox/internal/dynamobench"
	"github.com/outboxrelay/outbox/store/dynamodb"

	"github.com/outboxrelay/outbox/internal/redact"
)

// DynamoRequests is what DynamoDB requests our relay made in the timed
// part of the dynamodb/relay-key runs (from Start until the outbox was
// empty: leases, heartbeats, idle polls included), from the store's
// request accounting (dynamodb.Store.Stats).
type DynamoRequests struct {
	// Requests and ConsumedCapacity hold one entry per run.
	Requests         []int64   `json:"requests"`
	ConsumedCapacity []float64 `json:"consumed_capacity"`
	// RequestsPerMessage and CapacityPerMessage are the totals over all
	// runs divided by the messages relayed in them.
	RequestsPerMessage float64 `json:"requests_per_message"`
	CapacityPerMessage float64 `json:"capacity_per_message"`
	// Operations sums the requests per DynamoDB operation over all runs.
	Operations map[string]dynamodb.OpStats `json:"operations"`
}

// OutstandingReport is the dynamodb/outstanding scenario's outcome: ADR
// 0034's case, finding the outstanding messages of Topics × Shards, the
// older way (a Query per topic and shard) and ours (a parallel Scan of
// ScanConcurrency segments).
type OutstandingReport struct {
	Scenario        string           `json:"scenario"`
	Table           string           `json:"table"`
	Topics          int              `json:"topics"`
	Shards          int              `json:"shards"`
	ScanConcurrency int              `json:"scan_concurrency"`
	Rows            []OutstandingRow `json:"rows"`
	// Err is set when the scenario failed.
	Err string `json:"error,omitempty"`
}

// OutstandingRow is one outbox state of the comparison.
type OutstandingRow struct {
	// Outstanding is how many messages the outbox held (0: empty).
	Outstanding int                   `json:"outstanding"`
	Older       dynamodb.RequestCount `json:"older"`
	Ours        dynamodb.RequestCount `json:"ours"`
}

// outstandingTopics are the ADR case's topics.
var outstandingTopics = []string{"orders.created", "orders.paid", "orders.shipped", "users.created", "users.deleted"}

// dynamoEnv is what the DynamoDB scenarios run against: a table of the
// bench's own for the relay, another for the ADR case (created on first
// use), and the broker.
type dynamoEnv struct {
	opts   dynamodb.Options // the relay table's, as parsed from the URL
	relay  *dynamodb.Store  // the relay's store: its Stats are the relay's requests
	check  *dynamodb.Store  // the bench's own requests: backlog, counts
	adr    *dynamodb.Store  // the ADR case's table (nil until used)
	broker *Broker
	log    *slog.Logger
	meter  *meter

	payloads [][]byte
	payload  int
}

// dynamoSuffixMax is the longest suffix the bench appends to the URL's
// table name: "_bench_" + 8 hex digits + "_adr".
const dynamoSuffixMax = len("_bench_") + 8 + len("_adr")

// prefillWriters is how many BatchWriteItem requests the backlog writer
// runs at once.
const prefillWriters = 8

// newDynamoEnv parses the store URL and creates the relay's table,
// TABLE_bench_<random> (Migrate: on-demand billing, waits until ACTIVE).
// Close drops the tables.
func newDynamoEnv(ctx context.Context, o Options, broker *Broker, m *meter) (*dynamoEnv, error) {
	opts, err := dynamodb.ParseURL(o.Store) // checked by Validate
	if err != nil {
		return nil, invalid("Store", "store", "%v", err)
	}
	log := o.Logger
	if !log.Enabled(ctx, slog.LevelDebug) {
		log = slog.New(minLevel{log.Handler(), slog.LevelWarn})
	}
	opts.Table += "_bench_" + randomHex(4)
	opts.Logger = log
	e := &dynamoEnv{opts: opts, broker: broker, log: log, meter: m}
	if e.relay, err = dynamodb.New(ctx, opts); err != nil {
		return nil, invalid("Store", "store", "%v", err)
	}
	checkOpts := opts
	checkOpts.MaxOutstanding = 0 // count everything
	if e.check, err = dynamodb.New(ctx, checkOpts); err != nil {
		e.relay.Close()
		return nil, invalid("Store", "store", "%v", err)
	}
	if err := e.check.Migrate(ctx); err != nil {
		e.Close()
		return nil, fmt.Errorf("bench: create table %s: %w", opts.Table, err)
	}
	return e, nil
}

// Close drops the bench's tables (without waiting for the deletion) and
// releases the stores.
func (e *dynamoEnv) Close() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := e.check.DropTable(ctx); err != nil {
		e.log.Warn("bench: drop the relay's table", "err", err)
	}
	if e.adr != nil {
		if err := e.adr.DropTable(ctx); err != nil {
			e.log.Warn("bench: drop the ADR case's table", "err", err)
		}
		e.adr.Close()
	}
	e.check.Close()
	e.relay.Close()
}

// describe names the store for the output.
func (e *dynamoEnv) describe() string {
	o := e.relay.Options()
	where := "AWS"
	if o.Endpoint != "" {
		where = o.Endpoint
		if u, err := url.Parse(o.Endpoint); err == nil {
			where = redact.URL(u.String())
		}
	}
	delay := o.FetchDelay.String()
	if o.FetchDelay == dynamodb.FetchDelayNone {
		delay = "none"
	}
	return fmt.Sprintf("dynamodb (table %s at %s, region %s, %d shards, fetch delay %s)", o.Table, where, o.Region, o.Shards, delay)
}

// payloadFor returns the payload of message i (see Env.payloadFor).
func (e *dynamoEnv) payloadFor(k Knobs, i int) []byte {
	if e.payload != k.Payload || e.payloads == nil {
		e.payloads = make([][]byte, 256)
		for j := range e.payloads {
			e.payloads[j] = makePayload(k.Payload)
		}
		e.payload = k.Payload
	}
	return e.payloads[i%len(e.payloads)]
}

// prefill writes a backlog of n messages (topic Topic, k.Keys keys
// round-robin, k.Payload bytes) with BatchWriteItem, 25 items a request,
// prefillWriters requests at once; unprocessed items are resent with
// backoff. Items are built in message order first, so each key's Seqs
// follow its message order. It is not the transactional write: a fast way
// to make a backlog, untimed.
func (e *dynamoEnv) prefill(ctx context.Context, k Knobs, n int) error {
	const perRequest = 25 // BatchWriteItem's limit
	items := make([]map[string]types.AttributeValue, n)
	for i := range n {
		m := outbox.Message{Topic: Topic, Key: "key-" + strconv.Itoa(i%k.Keys), Payload: e.payloadFor(k, i)}
		w, err := e.check.TransactWriteItem(&m)
		if err != nil {
			return fmt.Errorf("bench: build message %d: %w", i, err)
		}
		items[i] = w.Put.Item
	}
	table := e.opts.Table
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(prefillWriters)
	for lo := 0; lo < n; lo += perRequest {
		chunk := items[lo:min(n, lo+perRequest)]
		g.Go(func() error {
			reqs := make([]types.WriteRequest, len(chunk))
			for i, item := range chunk {
				reqs[i] = types.WriteRequest{PutRequest: &types.PutRequest{Item: item}}
			}
			delay := 20 * time.Millisecond
			for attempt := 1; ; attempt++ {
				out, err := e.check.Client().BatchWriteItem(gctx, &awsdynamodb.BatchWriteItemInput{
					RequestItems:           map[string][]types.WriteRequest{table: reqs},
					ReturnConsumedCapacity: types.ReturnConsumedCapacityTotal,
				}, e.check.CallOptions()...)
				if err != nil {
					return fmt.Errorf("bench: write the backlog: %w", err)
				}
				e.meter.done.Add(int64(len(reqs) - len(out.UnprocessedItems[table])))
				if reqs = out.UnprocessedItems[table]; len(reqs) == 0 {
					return nil
				}
				if attempt == dynamodb.UnprocessedAttemptsDefault {
					return fmt.Errorf("bench: write the backlog: %d item(s) still unprocessed after %d attempts (throttled?)", len(reqs), attempt)
				}
				if err := sleepCtx(gctx, delay); err != nil {
					return err
				}
				delay = min(2*delay, dynamodb.UnprocessedBackoffMax)
			}
		})
	}
	return g.Wait()
}

// sleepCtx waits d or until ctx ends.
func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return context.Cause(ctx)
	case <-t.C:
		return nil
	}
}

// diffStats returns after − before, per operation (operations with no
// request in between left out).
func diffStats(before, after map[string]dynamodb.OpStats) map[string]dynamodb.OpStats {
	d := map[string]dynamodb.OpStats{}
	for op, a := range after {
		b := before[op]
		if a.Requests == b.Requests {
			continue
		}
		d[op] = dynamodb.OpStats{Requests: a.Requests - b.Requests, Errors: a.Errors - b.Errors, ConsumedCapacity: a.ConsumedCapacity - b.ConsumedCapacity}
	}
	return d
}

// dynamoRun is one dynamodb/relay-key run.
type dynamoRun struct {
	RunResult
	ops map[string]dynamodb.OpStats
}

// relayKey drains a backlog of k.Messages from the relay's table with our
// relay (ordering key, k.Workers workers, batches of k.Batch), timed from
// Start until the outbox is empty, and counts the relay store's requests
// over that span. The backlog is written first (untimed), then the bench
// waits out the store's FetchDelay so that the whole backlog is fetchable
// when the clock starts.
func (e *dynamoEnv) relayKey(ctx context.Context, k Knobs) (dynamoRun, error) {
	n := k.Messages
	e.meter.start("writing", n)
	if left, err := e.check.OutstandingCount(ctx); err != nil || left != 0 {
		if err == nil {
			err = fmt.Errorf("bench: the table holds %d outstanding messages from an earlier run", left)
		}
		return dynamoRun{}, err
	}
	if err := e.broker.Reset(ctx); err != nil {
		return dynamoRun{}, err
	}
	if err := e.prefill(ctx, k, n); err != nil {
		return dynamoRun{}, err
	}
	if d := e.relay.Options().FetchDelay; d > 0 {
		e.meter.setPhase("waiting out the fetch delay")
		if err := sleepCtx(ctx, d); err != nil {
			return dynamoRun{}, err
		}
	}
	e.meter.setPhase("running")
	e.meter.done.Store(0)

	pub, err := e.broker.NewPublisher(ctx)
	if err != nil {
		return dynamoRun{}, err
	}
	defer pub.Close()
	var clock relayClock
	relay, err := outbox.NewRelay(e.relay, pub, outbox.Config{
		Ordering:  outbox.OrderingKey,
		Workers:   k.Workers,
		BatchSize: k.Batch,
		Logger:    e.log,
		Hook:      clock.hook,
	})
	if err != nil {
		return dynamoRun{}, err
	}

	tctx, untimed := timed(ctx)
	before := e.relay.Stats()
	start := time.Now()
	if err := relay.Start(tctx); err != nil {
		untimed()
		return dynamoRun{}, err
	}
	err = pollUntil(ctx, DynamoRelayKeyName, func() (bool, int64, error) {
		st := relay.Stats()
		e.meter.done.Store(st.Published)
		if st.DeadLettered > 0 {
			return false, 0, fmt.Errorf("bench: the relay dead-lettered %d messages", st.DeadLettered)
		}
		if st.Published < int64(n) {
			return false, st.Published, nil
		}
		left, err := e.check.OutstandingCount(ctx)
		return left == 0, st.Published - left, err
	})
	elapsed := time.Since(start)
	after := e.relay.Stats()
	untimed()
	stopErr := relay.Stop()
	if err != nil {
		return dynamoRun{}, err
	}
	if stopErr != nil {
		return dynamoRun{}, fmt.Errorf("bench: stop the relay: %w", stopErr)
	}
	r := dynamoRun{RunResult: newRun(n, elapsed), ops: diffStats(before, after)}
	r.Failed = relay.Stats().Failed
	r.Relay = clock.times()
	e.meter.setPhase("checking")
	if r.Left, err = e.check.OutstandingCount(ctx); err != nil {
		return r, err
	}
	if r.Stored, err = e.broker.Stored(ctx); err != nil {
		return r, err
	}
	return r, r.check()
}

// outstanding runs ADR 0034's case on a table of its own with
// OutstandingShards shards (and the URL's ScanConcurrency and PageSize):
// dynamobench.CompareOutstanding on the empty outbox, then after
// dynamobench.FillBacklog of backlog messages over OutstandingTopics topics
// (store/dynamodb's helpers, registered there).
func (e *dynamoEnv) outstanding(ctx context.Context, backlog int) (*OutstandingReport, error) {
	opts := e.opts
	opts.Table += "_adr"
	opts.Shards = OutstandingShards
	opts.MaxOutstanding = 0
	rep := &OutstandingReport{Scenario: DynamoOutstandingName, Table: opts.Table, Topics: len(outstandingTopics), Shards: opts.Shards}
	e.meter.start("creating the table", 0)
	s, err := dynamodb.New(ctx, opts)
	if err != nil {
		return rep, err
	}
	e.adr = s
	rep.ScanConcurrency = s.Options().ScanConcurrency
	if err := s.Migrate(ctx); err != nil {
		return rep, fmt.Errorf("bench: create table %s: %w", opts.Table, err)
	}
	e.meter.setPhase("comparing (empty outbox)")
	older, ours, err := dynamobench.CompareOutstanding(ctx, s, outstandingTopics, 0)
	if err != nil {
		return rep, err
	}
	rep.Rows = append(rep.Rows, OutstandingRow{Outstanding: 0, Older: dynamodb.RequestCount(older), Ours: dynamodb.RequestCount(ours)})
	e.meter.start("writing", backlog)
	if err := dynamobench.FillBacklog(ctx, s, outstandingTopics, backlog); err != nil {
		return rep, err
	}
	e.meter.setPhase(fmt.Sprintf("comparing (%d outstanding)", backlog))
	older, ours, err = dynamobench.CompareOutstanding(ctx, s, outstandingTopics, 0)
	if err != nil {
		return rep, err
	}
	rep.Rows = append(rep.Rows, OutstandingRow{Outstanding: backlog, Older: dynamodb.RequestCount(older), Ours: dynamodb.RequestCount(ours)})
	return rep, nil
}

// runDynamo is Run for a DynamoDB store: Runs rounds of
// dynamodb/relay-key, then dynamodb/outstanding once, each if selected.
func runDynamo(ctx context.Context, o Options, names []string, messagesDefaulted bool) (*Report, error) {
	began := time.Now()
	fmt.Fprintf(o.Notices, "bench: --store is DynamoDB: running only the DynamoDB scenarios (%s); the seeds, ceilings, scaling and steady scenarios are PostgreSQL-only\n",
		strings.Join(names, ", "))
	if messagesDefaulted {
		fmt.Fprintf(o.Notices, "bench: DynamoDB backlog: %s messages (the default with DynamoDB, as dynalite is slow; set --messages for another)\n", thousands(float64(o.Messages)))
	}
	if o.Broker == "" {
		fmt.Fprintln(o.Notices, "bench: no --broker given: starting an embedded NATS server (JetStream, file storage)")
	}
	broker, err := OpenBroker(ctx, o.Broker, o)
	if err != nil {
		return nil, err
	}
	defer broker.Close()
	m := &meter{}
	env, err := newDynamoEnv(ctx, o, broker, m)
	if err != nil {
		return nil, err
	}
	defer env.Close()
	storeName := env.describe()
	rep := &Report{Store: storeName, Broker: broker.Name, DB: DBExternal, Options: o, dynamo: &dynamoNotes{messagesDefaulted: messagesDefaulted}}
	stopProgress := startProgress(o, m)
	defer stopProgress()

	var errs []error
	if slices.Contains(names, DynamoRelayKeyName) {
		res := &Result{Scenario: DynamoRelayKeyName, Store: storeName, DB: DBExternal, Broker: broker.Name, Workers: o.Workers, Batch: o.Batch, Messages: o.Messages,
			DynamoDB: &DynamoRequests{Requests: []int64{}, ConsumedCapacity: []float64{}, Operations: map[string]dynamodb.OpStats{}}}
		rep.Results = append(rep.Results, res)
		k := Knobs{Messages: o.Messages, Payload: o.Payload, Keys: o.Keys, Batch: o.Batch, Workers: o.Workers}
		for round := 1; round <= o.Runs; round++ {
			m.scenario(DynamoRelayKeyName, round, o.Runs)
			var run dynamoRun
			var err error
			pprof.Do(ctx, pprof.Labels("scenario", DynamoRelayKeyName), func(ctx context.Context) { run, err = env.relayKey(ctx, k) })
			if err != nil {
				if ctx.Err() != nil {
					rep.finishDynamo(began)
					return rep, context.Cause(ctx)
				}
				res.Err = err.Error()
				errs = append(errs, fmt.Errorf("%s: %w", DynamoRelayKeyName, err))
				break
			}
			res.Details = append(res.Details, run.RunResult)
			res.Failed += run.Failed
			res.DynamoDB.add(run)
		}
	}
	if slices.Contains(names, DynamoOutstandingName) {
		m.scenario(DynamoOutstandingName, 1, 1)
		out, err := env.outstanding(ctx, o.OutstandingBacklog)
		rep.Outstanding = out
		if err != nil {
			if ctx.Err() != nil {
				rep.finishDynamo(began)
				return rep, context.Cause(ctx)
			}
			out.Err = err.Error()
			errs = append(errs, fmt.Errorf("%s: %w", DynamoOutstandingName, err))
		}
	}
	rep.finishDynamo(began)
	return rep, errors.Join(errs...)
}

// add records one run's requests.
func (d *DynamoRequests) add(r dynamoRun) {
	var total dynamodb.RequestCount
	for op, s := range r.ops {
		total.Requests += s.Requests
		total.ConsumedCapacity += s.ConsumedCapacity
		t := d.Operations[op]
		t.Requests += s.Requests
		t.Errors += s.Errors
		t.ConsumedCapacity += s.ConsumedCapacity
		d.Operations[op] = t
	}
	d.Requests = append(d.Requests, total.Requests)
	d.ConsumedCapacity = append(d.ConsumedCapacity, total.ConsumedCapacity)
}

// finishDynamo is finish for a DynamoDB report: medians, requests per
// message; the targets compare PostgreSQL scenarios and are left
// out.
func (r *Report) finishDynamo(began time.Time) {
	r.finish(began)
	r.Targets = []Target{}
	for _, res := range r.Results {
		d := res.DynamoDB
		if d == nil {
			continue
		}
		var msgs, reqs int64
		var capacity float64
		for i, run := range res.Details {
			msgs += int64(run.Messages)
			reqs += d.Requests[i]
			capacity += d.ConsumedCapacity[i]
		}
		if msgs > 0 {
			d.RequestsPerMessage = float64(reqs) / float64(msgs)
			d.CapacityPerMessage = capacity / float64(msgs)
		}
	}
}

// dynamoNotes is what the table says about a DynamoDB run.
type dynamoNotes struct {
	messagesDefaulted bool
}

// dynamoTables prints, for a DynamoDB run, what only ran, the requests per
// message relayed (with a row per operation) and the ADR 0034 comparison.
func (r *Report) dynamoTables() string {
	if r.dynamo == nil {
		return ""
	}
	var b strings.Builder
	fmt.Fprintf(&b, "\nDynamoDB: only the DynamoDB scenarios ran; the seeds, ceilings, scaling and steady scenarios are PostgreSQL-only\n")
	if r.dynamo.messagesDefaulted {
		fmt.Fprintf(&b, "backlog: %s messages, the default with DynamoDB (dynalite is slow; set --messages for another)\n", thousands(float64(r.Options.Messages)))
	}
	for _, res := range r.Results {
		d := res.DynamoDB
		if d == nil || len(d.Requests) == 0 {
			continue
		}
		var reqs int64
		var capacity float64
		var msgs int
		for i := range d.Requests {
			reqs += d.Requests[i]
			capacity += d.ConsumedCapacity[i]
			msgs += res.Details[i].Messages
		}
		fmt.Fprintf(&b, "\n%s: DynamoDB requests of the relay's store from Start until the outbox was empty (leases, heartbeats and idle polls included), %d run(s)\n", res.Scenario, len(d.Requests))
		tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "OPERATION\tREQUESTS\tPER MESSAGE\tERRORS\tCAPACITY UNITS\tPER MESSAGE")
		for _, op := range slices.Sorted(maps.Keys(d.Operations)) {
			s := d.Operations[op]
			fmt.Fprintf(tw, "%s\t%s\t%.4f\t%d\t%.1f\t%.3f\n", op, thousands(float64(s.Requests)), float64(s.Requests)/float64(msgs),
				s.Errors, s.ConsumedCapacity, s.ConsumedCapacity/float64(msgs))
		}
		fmt.Fprintf(tw, "total\t%s\t%.4f\t\t%.1f\t%.3f\n", thousands(float64(reqs)), d.RequestsPerMessage, capacity, d.CapacityPerMessage)
		_ = tw.Flush()
	}
	if out := r.Outstanding; out != nil {
		fmt.Fprintf(&b, "\n%s: ADR 0034's case, find the outstanding messages of %d topics × %d shards (table %s)\n", out.Scenario, out.Topics, out.Shards, out.Table)
		if out.Err != "" {
			fmt.Fprintf(&b, "FAILED: %s\n", out.Err)
		}
		if len(out.Rows) > 0 {
			tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
			fmt.Fprintf(tw, "OUTBOX\tOLDER: QUERY PER TOPIC×SHARD\tCAPACITY\tOURS: PARALLEL SCAN (%d SEGMENTS)\tCAPACITY\n", out.ScanConcurrency)
			for _, row := range out.Rows {
				name := "empty"
				if row.Outstanding > 0 {
					name = thousands(float64(row.Outstanding)) + " outstanding"
				}
				fmt.Fprintf(tw, "%s\t%s requests\t%.1f\t%s requests\t%.1f\n", name, thousands(float64(row.Older.Requests)), row.Older.ConsumedCapacity,
					thousands(float64(row.Ours.Requests)), row.Ours.ConsumedCapacity)
			}
			_ = tw.Flush()
		}
	}
	return b.String()
}
