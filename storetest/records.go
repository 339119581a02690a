package storetest

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/outboxrelay/outbox"
)

func testPartitions(s *suite) {
	p, err := s.src.Partitions(s.ctx)
	if err != nil {
		s.Fatalf("Partitions: %v", err)
	}
	if p != s.p {
		s.Fatalf("Partitions = %d, want %d (Harness.Partitions)", p, s.p)
	}
}

func testRoundTrip(s *suite) {
	binary := make([]byte, 256)
	for i := range binary {
		binary[i] = byte(i) // NUL, invalid UTF-8, everything
	}
	full := outbox.Message{
		ID:        outbox.NewID(),
		Topic:     "round.trip-full_1",
		Key:       "order-42",
		Payload:   binary,
		Headers:   map[string]string{"trace-id": "abc123", "Unicode": "ünï €", "empty": ""},
		CreatedAt: time.Date(2024, 5, 6, 7, 8, 9, 123456789, time.FixedZone("X", 3600)),
	}
	unicodeKey := outbox.Message{
		ID:      outbox.NewID(),
		Topic:   "round.trip.unicode",
		Key:     "clé/ü 🙂 \"quoted\" 'x'",
		Payload: []byte(strings.Repeat("large payload ", 64<<10/14)),
	}
	minimal := outbox.Message{Topic: "round.trip.minimal"} // no ID, key, payload, headers, time
	before := time.Now()
	s.write(full, unicodeKey, minimal)
	after := time.Now()

	recs := s.fetch()
	if len(recs) != 3 {
		s.Fatalf("fetched %d records, want 3", len(recs))
	}
	s.checkSeqOrder(recs)
	for _, r := range recs {
		if r.Attempts != 0 || !r.NextAttemptAt.IsZero() || r.LastError != "" {
			s.Errorf("%s: fresh record has Attempts %d, NextAttemptAt %v, LastError %q; want zero values", r.ID, r.Attempts, r.NextAttemptAt, r.LastError)
		}
		if r.Partition < 0 || r.Partition >= s.p {
			s.Errorf("%s: Partition %d out of [0, %d)", r.ID, r.Partition, s.p)
		}
		switch r.Topic {
		case full.Topic:
			s.checkMessage(r.Message, full)
			if want := outbox.PartitionOf(full.Key, s.p); r.Partition != want {
				s.Errorf("Partition %d, want PartitionOf(%q, %d) = %d", r.Partition, full.Key, s.p, want)
			}
		case unicodeKey.Topic:
			unicodeKey.CreatedAt = r.CreatedAt // checked below
			s.checkMessage(r.Message, unicodeKey)
			if want := outbox.PartitionOf(unicodeKey.Key, s.p); r.Partition != want {
				s.Errorf("Partition %d, want %d", r.Partition, want)
			}
			s.checkWriteTime(r, before, after)
		case minimal.Topic:
			if err := outbox.ValidateID(r.ID); err != nil {
				s.Errorf("Write did not assign a valid ID: %v", err)
			}
			if r.Key != "" || len(r.Payload) != 0 || len(r.Headers) != 0 {
				s.Errorf("minimal message came back with Key %q, Payload %q, Headers %v; want them empty", r.Key, r.Payload, r.Headers)
			}
			s.checkWriteTime(r, before, after)
		default:
			s.Errorf("unexpected record %+v", r)
		}
	}
	// The caller's messages are not modified by Write.
	if minimal.ID != "" || !minimal.CreatedAt.IsZero() {
		s.Errorf("Write modified the caller's message: ID %q, CreatedAt %v", minimal.ID, minimal.CreatedAt)
	}
}

// checkWriteTime checks that Write set CreatedAt between before and after
// (with a second of slack for a store that uses its own clock).
func (s *suite) checkWriteTime(r outbox.Record, before, after time.Time) {
	s.Helper()
	if r.CreatedAt.Before(before.Add(-time.Second)) || r.CreatedAt.After(after.Add(time.Second)) {
		s.Errorf("%s: CreatedAt %v, want the time of Write (between %v and %v)", r.ID, r.CreatedAt, before, after)
	}
}

func testSeqOrder(s *suite) {
	keys := []string{"alpha", "beta", "gamma"}
	var written []outbox.Message
	// Ten transactions with a message of each key, then one transaction
	// with five messages of one key, then messages without a key.
	for i := range 10 {
		var tx []outbox.Message
		for _, k := range keys {
			m := newMessages(1, "seq.order", k)[0]
			m.Payload = append(m.Payload, byte('0'+i))
			tx = append(tx, m)
		}
		s.write(tx...)
		written = append(written, tx...)
	}
	five := newMessages(5, "seq.batch", "alpha")
	s.write(five...)
	written = append(written, five...)
	nokey := newMessages(10, "seq.nokey", "")
	s.write(nokey...)
	written = append(written, nokey...)

	recs := s.fetch()
	if len(recs) != len(written) {
		s.Fatalf("fetched %d records, want %d", len(recs), len(written))
	}
	s.checkSeqOrder(recs)
	got := s.byID(recs)
	// Per key, Seq follows write order.
	lastSeq := map[string]int64{}
	for _, m := range written {
		r, ok := got[m.ID]
		if !ok {
			s.Fatalf("message %s not fetched", m.ID)
		}
		if m.Key == "" {
			if r.Partition < 0 || r.Partition >= s.p {
				s.Errorf("%s: Partition %d out of [0, %d)", m.ID, r.Partition, s.p)
			}
			continue
		}
		if want := outbox.PartitionOf(m.Key, s.p); r.Partition != want {
			s.Errorf("%s: key %q in partition %d, want PartitionOf = %d", m.ID, m.Key, r.Partition, want)
		}
		if r.Seq <= lastSeq[m.Key] {
			s.Errorf("key %q: Seq %d written after Seq %d", m.Key, r.Seq, lastSeq[m.Key])
		}
		lastSeq[m.Key] = r.Seq
	}
}

func testFetchAfterLimit(s *suite) {
	p := outbox.PartitionOf("fetch-key", s.p)
	msgs := newMessages(7, "fetch.p", "fetch-key")
	s.write(msgs[:3]...)
	s.write(msgs[3:]...)
	q := s.otherPartition(p)
	var others []outbox.Message
	if q >= 0 {
		others = newMessages(4, "fetch.q", s.keysIn(q, 1)[0])
		s.write(others...)
	}

	all := s.fetch(p)
	if len(all) != 7 {
		s.Fatalf("partition %d: fetched %d records, want 7", p, len(all))
	}
	for i, r := range all {
		if r.ID != msgs[i].ID {
			s.Fatalf("partition %d: record %d is %s, want %s (write order)", p, i, r.ID, msgs[i].ID)
		}
	}

	// The limit applies per cursor.
	cursors := s.cursors(p)
	if q >= 0 {
		cursors = s.cursors(p, q)
	}
	recs, err := s.src.Fetch(s.ctx, cursors, 3)
	if err != nil {
		s.Fatalf("Fetch: %v", err)
	}
	var inP, inQ []outbox.Record
	for _, r := range recs {
		switch r.Partition {
		case p:
			inP = append(inP, r)
		case q:
			inQ = append(inQ, r)
		default:
			s.Fatalf("Fetch returned record %s of partition %d, not asked for", r.ID, r.Partition)
		}
	}
	if len(inP) != 3 || inP[0].ID != msgs[0].ID || inP[2].ID != msgs[2].ID {
		s.Errorf("limit 3, partition %d: got %v, want the first 3 records", p, ids(inP))
	}
	if q >= 0 && (len(inQ) != 3 || inQ[0].ID != others[0].ID) {
		s.Errorf("limit 3, partition %d: got %v, want the first 3 of %d records", q, ids(inQ), len(others))
	}

	// After skips what was read.
	next, err := s.src.Fetch(s.ctx, []outbox.Cursor{{Lease: outbox.Lease{Partition: p}, After: all[2].Seq}}, 3)
	if err != nil {
		s.Fatalf("Fetch: %v", err)
	}
	if len(next) != 3 || next[0].ID != msgs[3].ID || next[2].ID != msgs[5].ID {
		s.Errorf("After the 3rd record, limit 3: got %v, want records 4 to 6", ids(next))
	}
	last, err := s.src.Fetch(s.ctx, []outbox.Cursor{{Lease: outbox.Lease{Partition: p}, After: all[6].Seq}}, 3)
	if err != nil {
		s.Fatalf("Fetch: %v", err)
	}
	if len(last) != 0 {
		s.Errorf("After the last record: got %v, want none", ids(last))
	}
	// A partition with nothing written returns nothing.
	for e := range s.p {
		if e == p || e == q {
			continue
		}
		if recs := s.fetch(e); len(recs) != 0 {
			s.Errorf("partition %d: got %v, want nothing", e, ids(recs))
		}
		break
	}
}

// bigHeaders returns the most headers of the longest values Validate
// allows one by one: together far over JetStream's 64 KiB header limit.
func bigHeaders() map[string]string {
	h := map[string]string{}
	for i := range outbox.MaxHeaders {
		h[fmt.Sprintf("X-Big-%02d", i)] = strings.Repeat("v", outbox.MaxHeaderValueLen)
	}
	return h
}

func testWriteValidation(s *suite) {
	valid := outbox.Message{ID: outbox.NewID(), Topic: "valid.topic"}
	cases := []struct {
		msg   outbox.Message
		field string
	}{
		{outbox.Message{Topic: "bad topic!"}, "Topic"},
		{outbox.Message{Topic: ""}, "Topic"},
		{outbox.Message{Topic: "big", Payload: make([]byte, outbox.MaxPayloadDefault+1)}, "Payload"},
		{outbox.Message{Topic: "t", ID: "NOT-A-UUID"}, "ID"},
		{outbox.Message{Topic: "t", Headers: map[string]string{"Nats-Msg-Id": "x"}}, "Headers"},
		// Keys and header values a broker would alter are refused.
		{outbox.Message{Topic: "t", Key: "line\nbreak"}, "Key"},
		{outbox.Message{Topic: "t", Key: " leading space"}, "Key"},
		{outbox.Message{Topic: "t", Key: "bell\a"}, "Key"},
		{outbox.Message{Topic: "t", Headers: map[string]string{"X-Trace": "trailing space "}}, "Headers"},
		{outbox.Message{Topic: "t", Headers: map[string]string{"X-Trace": "cr\rlf\n"}}, "Headers"},
		// The payload limit counts the headers as published.
		{outbox.Message{Topic: "t", Payload: make([]byte, outbox.MaxPayloadDefault)}, "Payload"},
		{outbox.Message{Topic: "t", Headers: bigHeaders()}, "Headers"},
	}
	for _, c := range cases {
		err := s.h.Write(s.ctx, valid, c.msg)
		var ve *outbox.ValidationError
		if !errors.As(err, &ve) || ve.Field != c.field {
			s.Errorf("Write with an invalid %s: got %v, want a *outbox.ValidationError on %s", c.field, err, c.field)
		}
	}
	if recs := s.fetch(); len(recs) != 0 {
		s.Errorf("invalid writes left %d records, want none (the valid message of each batch included)", len(recs))
	}
	// An empty write is fine and writes nothing.
	if err := s.h.Write(s.ctx); err != nil {
		s.Errorf("Write of no messages: %v", err)
	}
}

func testUnsettled(s *suite) {
	s.needLeases()
	key := "unsettled-key"
	p := outbox.PartitionOf(key, s.p)
	msgs := newMessages(5, "unsettled", key)
	s.write(msgs...)
	recs := s.fetch(p)
	if len(recs) != 5 {
		s.Fatalf("fetched %d records, want 5", len(recs))
	}
	unsettled := func(after int64) []outbox.RecordRef {
		s.Helper()
		refs, err := s.s.Unsettled(s.ctx, []outbox.Cursor{{Lease: outbox.Lease{Partition: p}, After: after}})
		if err != nil {
			s.Fatalf("Unsettled: %v", err)
		}
		return refs
	}
	refs := sortRefs(unsettled(recs[2].Seq))
	want := []outbox.RecordRef{
		{ID: recs[0].ID, Partition: p, Seq: recs[0].Seq},
		{ID: recs[1].ID, Partition: p, Seq: recs[1].Seq},
		{ID: recs[2].ID, Partition: p, Seq: recs[2].Seq},
	}
	if !slices.Equal(refs, want) {
		s.Errorf("Unsettled(After = 3rd Seq) = %v, want %v", refs, want)
	}
	if refs := unsettled(0); len(refs) != 0 {
		s.Errorf("Unsettled(After 0) = %v, want none", refs)
	}
	node := "unsettled-node"
	l, _ := leaseOf(s.acquire(node, nil, s.p), p)
	s.settle(node, outbox.Settlement{Lease: l, Delivered: []string{recs[1].ID}})
	if refs := sortRefs(unsettled(recs[2].Seq)); !slices.Equal(refs, []outbox.RecordRef{want[0], want[2]}) {
		s.Errorf("after delivering the 2nd record: Unsettled = %v, want %v", refs, []outbox.RecordRef{want[0], want[2]})
	}
	// Other partitions' cursors see nothing of p.
	if q := s.otherPartition(p); q >= 0 {
		refs, err := s.s.Unsettled(s.ctx, []outbox.Cursor{{Lease: outbox.Lease{Partition: q}, After: recs[4].Seq}})
		if err != nil {
			s.Fatalf("Unsettled: %v", err)
		}
		if len(refs) != 0 {
			s.Errorf("Unsettled of partition %d = %v, want none", q, refs)
		}
	}
}

// sortRefs sorts refs by partition and Seq: Unsettled promises no order.
func sortRefs(refs []outbox.RecordRef) []outbox.RecordRef {
	refs = slices.Clone(refs)
	slices.SortFunc(refs, func(a, b outbox.RecordRef) int {
		return cmp.Or(cmp.Compare(a.Partition, b.Partition), cmp.Compare(a.Seq, b.Seq))
	})
	return refs
}
