package console

import (
	"encoding/json"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/outboxrelay/outbox"
)

// backlogGapMin is the shortest pause in the backlog samples that breaks
// the chart's line.
const backlogGapMin = 15 * time.Second

// Hot partitions: a partition stands out when its backlog is at least
// hotFactor times the mean backlog of all partitions and at least hotMin.
const (
	hotFactor = 3
	hotMin    = 100
)

// overviewView is the overview page and its live part.
type overviewView struct {
	page
	Live *overviewLive
}

// overviewLive is the part of the overview that refreshes.
type overviewLive struct {
	At        time.Time
	NoStatus  bool   // the store cannot report its status
	StatusErr string // the last read failed
	Took      string // how long the last read took
	// AllBlocked: every topic with messages waiting has its destination
	// blocked; nothing can be published.
	AllBlocked  bool
	Outstanding int64
	OldestAge   string
	DeadLetters int64
	Topics      []topicRow
	Relays      []relayRow
	Hot         []int // hot partitions
	Relay       *relayView
	Backlog     chart
	Throughput  chart
	// ThroughputNote says why there is no throughput chart.
	ThroughputNote string
	PollMillis     int64
	// Horizon is the database's xmin horizon (see horizon.go); nil when
	// the store does not report it.
	Horizon *horizonView
}

type topicRow struct {
	Topic     string `json:"topic"`
	Count     int64  `json:"count"`
	OldestAge string `json:"oldest_age,omitempty"`
}

type relayRow struct {
	Node       string `json:"node"`
	Count      int    `json:"partition_count"`
	Partitions string `json:"partitions"`
	Epochs     string `json:"epochs,omitempty"`
	ExpiresIn  string `json:"heartbeat_expires_in"`
	LeaseIn    string `json:"next_lease_expiry_in,omitempty"`
	This       bool   `json:"this_process"`
}

// relayView is the relay of this process.
type relayView struct {
	Node          string               `json:"node"`
	Ready         bool                 `json:"ready"`
	Leases        int                  `json:"leases"`
	Published     int64                `json:"published"`
	DeadLettered  int64                `json:"dead_lettered"`
	Failed        int64                `json:"failed"`
	PublishedRate string               `json:"published_per_second"`
	BlockedKnown  bool                 `json:"blocked_known"`
	Blocked       []BlockedDestination `json:"blocked"`
}

// live builds the live part of the overview from the current snapshot.
func (s *Server) live(r *http.Request) *overviewLive {
	snap := s.ov.snapshot(r.Context())
	now := s.now()
	v := &overviewLive{At: snap.At, NoStatus: s.admin == nil, PollMillis: s.opts.PollEvery.Milliseconds()}
	if snap.Err != nil {
		v.StatusErr = snap.Err.Error()
	}
	if snap.Took > 0 {
		v.Took = age(snap.Took)
	}
	if st := snap.Status; st != nil {
		v.Outstanding, v.DeadLetters = st.Outstanding, st.DeadLetters
		if !st.OldestCreatedAt.IsZero() {
			v.OldestAge = age(now.Sub(st.OldestCreatedAt))
		}
		for _, t := range st.Topics {
			row := topicRow{Topic: t.Topic, Count: t.Count}
			if !t.OldestCreatedAt.IsZero() {
				row.OldestAge = age(now.Sub(t.OldestCreatedAt))
			}
			v.Topics = append(v.Topics, row)
		}
		v.Relays = relayRows(st, now, s.opts.Live)
		v.Hot = hotPartitions(st.Partitions)
		v.Horizon = newHorizonView(st.XminHorizon)
	}
	backlog, live := s.ov.histories(now)
	var outstanding, dead []chartPoint
	for _, p := range backlog {
		outstanding = append(outstanding, chartPoint{p.At, float64(p.Outstanding), p.Every})
		dead = append(dead, chartPoint{p.At, float64(p.DeadLetters), p.Every})
	}
	// Samples come when someone watches: a line breaks only where nobody
	// did for a while.
	gap := max(backlogGapMin, 5*max(s.ov.refreshMin, s.opts.PollEvery))
	v.Backlog = makeChart("Backlog", "messages", now, gap,
		seriesData{"outstanding", "s-outstanding", outstanding}, seriesData{"dead letters", "s-dead", dead})
	if v.NoStatus {
		v.Backlog.Empty = "this store cannot report its backlog"
	}
	if l := s.opts.Live; l != nil {
		var pub, dl []chartPoint
		for _, p := range live {
			pub = append(pub, chartPoint{p.At, p.PublishedRate, 0})
			dl = append(dl, chartPoint{p.At, p.DeadRate, 0})
		}
		v.Throughput = makeChart("Throughput", "messages/s", now, 3*liveSampleEvery,
			seriesData{"published/s", "s-published", pub}, seriesData{"dead-lettered/s", "s-dead", dl})
		st := l.Stats()
		rv := &relayView{Node: l.Node(), Ready: l.Ready(), Leases: st.Leases, Published: st.Published, DeadLettered: st.DeadLettered, Failed: st.Failed}
		if len(pub) > 0 {
			rv.PublishedRate = formatNumber(pub[len(pub)-1].V)
		}
		if br, ok := l.(BlockedReporter); ok {
			rv.BlockedKnown, rv.Blocked = true, br.BlockedDestinations()
			v.AllBlocked = blockedWaiting(rv.Blocked, snap.Status)
		}
		v.Relay = rv
	} else {
		v.ThroughputNote = "Throughput and blocked destinations are known only to a running relay, not to the store: open the console of a relay (outbox relay --console) to see them."
	}
	return v
}

// blockedWaiting fills in the messages waiting for each blocked
// destination from the store's topic counts, when the relay did not say
// (a destination is the topic, or the topic behind the broker's prefix),
// and reports whether every topic with messages waiting is blocked: then
// nothing at all can be published.
func blockedWaiting(blocked []BlockedDestination, st *outbox.Status) bool {
	if st == nil || len(blocked) == 0 {
		return false
	}
	covered := map[string]bool{}
	for i := range blocked {
		b := &blocked[i]
		var n int64
		found := false
		for _, t := range st.Topics {
			if b.Destination == t.Topic || strings.HasSuffix(b.Destination, "."+t.Topic) || strings.HasSuffix(b.Destination, t.Topic) && len(b.Destination) > len(t.Topic) {
				n += t.Count
				found = true
				covered[t.Topic] = true
			}
		}
		if b.Waiting == 0 && found {
			b.Waiting = n
		}
		b.WaitingKnown = b.WaitingKnown || b.Waiting > 0 || found
	}
	for _, t := range st.Topics {
		if t.Count > 0 && !covered[t.Topic] {
			return false
		}
	}
	return true
}

// relayRows lists the live relays with the partitions they lease.
func relayRows(st *outbox.Status, now time.Time, l Live) []relayRow {
	type held struct {
		parts  []int
		epochs []int64
		next   time.Time
	}
	byNode := map[string]*held{}
	for _, p := range st.Partitions {
		if p.Owner == "" || !p.LeaseExpiresAt.After(now) {
			continue
		}
		h := byNode[p.Owner]
		if h == nil {
			h = &held{}
			byNode[p.Owner] = h
		}
		h.parts = append(h.parts, p.Partition)
		h.epochs = append(h.epochs, p.Epoch)
		if h.next.IsZero() || p.LeaseExpiresAt.Before(h.next) {
			h.next = p.LeaseExpiresAt
		}
	}
	var rows []relayRow
	for _, r := range st.Relays {
		row := relayRow{Node: r.Node, Count: r.Partitions, ExpiresIn: age(r.ExpiresAt.Sub(now)), This: l != nil && l.Node() == r.Node}
		if h := byNode[r.Node]; h != nil {
			row.Partitions = partitionRanges(h.parts)
			row.Epochs = epochRange(h.epochs)
			row.LeaseIn = age(h.next.Sub(now))
		}
		rows = append(rows, row)
	}
	return rows
}

// epochRange formats the epochs a relay holds: "7" or "3–12".
func epochRange(es []int64) string {
	if len(es) == 0 {
		return ""
	}
	lo, hi := slices.Min(es), slices.Max(es)
	if lo == hi {
		return itoa(lo)
	}
	return itoa(lo) + "–" + itoa(hi)
}

// hotPartitions returns the partitions whose backlog stands out.
func hotPartitions(ps []outbox.PartitionStatus) []int {
	if len(ps) == 0 {
		return nil
	}
	var sum int64
	for _, p := range ps {
		sum += p.Outstanding
	}
	mean := float64(sum) / float64(len(ps))
	var hot []int
	for _, p := range ps {
		if p.Outstanding >= hotMin && float64(p.Outstanding) >= hotFactor*mean {
			hot = append(hot, p.Partition)
		}
	}
	return hot
}

func (s *Server) handleOverview(w http.ResponseWriter, r *http.Request) {
	s.render(w, r, http.StatusOK, "overview", &overviewView{page: s.page(r, "overview", "Overview"), Live: s.live(r)})
}

// handleOverviewLive serves the live part of the overview, which
// console.js swaps in every PollEvery.
func (s *Server) handleOverviewLive(w http.ResponseWriter, r *http.Request) {
	var b strings.Builder
	if err := s.pages["overview"].ExecuteTemplate(&b, "overview-live", s.live(r)); err != nil {
		s.log.Error("console: render", "page", "overview-live", "err", err)
		http.Error(w, "render failed", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	_, _ = w.Write([]byte(b.String()))
}

// overviewJSON is /api/overview.
type overviewJSON struct {
	At               time.Time  `json:"at"`
	StatusKnown      bool       `json:"status_known"`
	StatusError      string     `json:"status_error,omitempty"`
	StatusTookMillis float64    `json:"status_took_ms"`
	Outstanding      int64      `json:"outstanding"`
	OldestAge        string     `json:"oldest_age,omitempty"`
	DeadLetters      int64      `json:"dead_letters"`
	Topics           []topicRow `json:"topics"`
	Relays           []relayRow `json:"relays"`
	HotPartitions    []int      `json:"hot_partitions"`
	Relay            *relayView `json:"relay"`
	// BlockedNote says where blocked destinations are known when this
	// console has no relay.
	BlockedNote string `json:"blocked_note,omitempty"`
	// XminHorizon is the database's xmin horizon, when the store reports it.
	XminHorizon *horizonView `json:"xmin_horizon,omitempty"`
}

func (s *Server) handleOverviewJSON(w http.ResponseWriter, r *http.Request) {
	v := s.live(r)
	snap := s.ov.snapshot(r.Context())
	out := overviewJSON{
		At: v.At.UTC(), StatusKnown: !v.NoStatus && v.StatusErr == "", StatusError: v.StatusErr,
		StatusTookMillis: float64(snap.Took.Microseconds()) / 1000,
		Outstanding:      v.Outstanding, OldestAge: v.OldestAge, DeadLetters: v.DeadLetters,
		Topics: v.Topics, Relays: v.Relays, HotPartitions: v.Hot, Relay: v.Relay, BlockedNote: v.ThroughputNote,
		XminHorizon: v.Horizon,
	}
	if out.Topics == nil {
		out.Topics = []topicRow{}
	}
	if out.Relays == nil {
		out.Relays = []relayRow{}
	}
	if out.HotPartitions == nil {
		out.HotPartitions = []int{}
	}
	w.Header().Set("Content-Type", "application/json")
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(out)
}

// partitionsView is the partitions page.
type partitionsView struct {
	page
	NoStatus  bool
	StatusErr string
	Rows      []partitionRow
	Hot       []int
	MaxCount  int64
	Total     int64
}

type partitionRow struct {
	outbox.PartitionStatus
	Hot      bool
	BarWidth int // percent of the largest backlog
	Expires  string
}

func (s *Server) handlePartitions(w http.ResponseWriter, r *http.Request) {
	v := &partitionsView{page: s.page(r, "partitions", "Partitions"), NoStatus: s.admin == nil}
	snap := s.ov.snapshot(r.Context())
	if snap.Err != nil {
		v.StatusErr = snap.Err.Error()
	}
	if st := snap.Status; st != nil {
		now := s.now()
		v.Hot = hotPartitions(st.Partitions)
		for _, p := range st.Partitions {
			v.MaxCount = max(v.MaxCount, p.Outstanding)
			v.Total += p.Outstanding
		}
		for _, p := range st.Partitions {
			row := partitionRow{PartitionStatus: p, Hot: slices.Contains(v.Hot, p.Partition)}
			if v.MaxCount > 0 {
				row.BarWidth = int(p.Outstanding * 100 / v.MaxCount)
			}
			if p.Owner != "" {
				row.Expires = age(p.LeaseExpiresAt.Sub(now))
			}
			v.Rows = append(v.Rows, row)
		}
	}
	s.render(w, r, http.StatusOK, "partitions", v)
}
