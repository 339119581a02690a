package postgres

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/outboxrelay/outbox"

	"github.com/outboxrelay/outbox/internal/uuid"
)

// walRetryMax bounds the backoff between attempts after errors other than
// "the slot is busy".
const walRetryMax = 30 * time.Second

// startReaderLocked starts the reader goroutine unless it runs. s.mu held.
func (s *WALStore) startReaderLocked() {
	if s.run != nil || s.closed.Load() {
		return
	}
	ctx, stop := context.WithCancel(context.Background())
	run := &walRun{stop: stop, done: make(chan struct{})}
	s.run = run
	go s.runReader(ctx, run)
}

// Start starts the reader, which takes the slot or stands by, without
// waiting. The first Hold does it too.
func (s *WALStore) Start() {
	s.mu.Lock()
	s.startReaderLocked()
	s.mu.Unlock()
}

// WaitStreaming waits until this process streams from the slot. It returns
// the error that stops the reader (the slot lost, a setting to change) if
// there is one, or ctx's.
func (s *WALStore) WaitStreaming(ctx context.Context) error {
	return s.waitRecv(ctx, func() (bool, error) {
		switch {
		case s.active:
			return true, nil
		case s.fatal != nil:
			return false, s.fatal
		case ctx.Err() != nil:
			return false, fmt.Errorf("postgres: waiting to stream from slot %q: %w", s.w.Slot, ctx.Err())
		case s.run == nil:
			return false, fmt.Errorf("postgres: waiting to stream from slot %q: the reader is not running (call Start)", s.w.Slot)
		}
		return false, nil
	})
}

// waitRecv waits until done, called with s.mu held at first and after
// each broadcast of recvCond (ctx's end broadcasts too), says it is done
// or fails.
func (s *WALStore) waitRecv(ctx context.Context, done func() (bool, error)) error {
	stop := context.AfterFunc(ctx, func() {
		s.mu.Lock()
		s.recvCond.Broadcast()
		s.mu.Unlock()
	})
	defer stop()
	s.mu.Lock()
	defer s.mu.Unlock()
	for {
		if ok, err := done(); ok || err != nil {
			return err
		}
		s.recvCond.Wait()
	}
}

// stopReader stops the reader, which confirms the settled position and
// releases the slot, and waits for it (until ctx ends).
func (s *WALStore) stopReader(ctx context.Context) {
	s.mu.Lock()
	run := s.run
	s.mu.Unlock()
	if run == nil {
		return
	}
	run.stop()
	select {
	case <-run.done:
	case <-ctx.Done():
	}
}

// runReader streams from the slot until stopped, taking it again after a
// loss and standing by while another relay holds it.
func (s *WALStore) runReader(ctx context.Context, run *walRun) {
	defer func() {
		s.mu.Lock()
		s.deactivateLocked(nil)
		s.run = nil
		s.mu.Unlock()
		close(run.done)
	}()
	failures := 0
	var lastErr string
	for ctx.Err() == nil {
		err := s.stream(ctx)
		if ctx.Err() != nil {
			if err != nil {
				s.logger().Warn("stopping the reader", "slot", s.w.Slot, "err", err)
			}
			return
		}
		s.mu.Lock()
		wasActive := s.active
		s.deactivateLocked(err)
		log := s.log
		s.mu.Unlock()
		wait := s.w.RetryInterval
		switch {
		case errors.Is(err, errSlotBusy):
			failures = 0
			if lastErr != err.Error() {
				log.Info("standing by: another relay streams from the replication slot", "slot", s.w.Slot, "retry_every", s.w.RetryInterval)
			}
		default:
			failures++
			wait = outbox.Backoff(failures, s.w.RetryInterval, max(s.w.RetryInterval, walRetryMax))
			if wasActive {
				log.Warn("lost the replication slot; the messages not confirmed will be read again", "slot", s.w.Slot, "err", err, "retry_in", wait)
			} else if lastErr != err.Error() || errors.Is(err, ErrSlotLost) {
				lvl := log.Warn
				if errors.Is(err, ErrSlotLost) {
					lvl = log.Error
				}
				lvl("cannot stream from the replication slot", "slot", s.w.Slot, "err", err, "retry_in", wait)
			}
		}
		lastErr = err.Error()
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}

// deactivateLocked records that the slot is not held: the buffer is
// dropped (what was not confirmed is read again by the next holder), the
// hold is void. err is why (nil: a graceful stop).
func (s *WALStore) deactivateLocked(err error) {
	if s.active {
		s.active = false
		if s.buf != nil {
			s.buf.reset(s.buf.confirmed)
		}
		s.holder = ""
		s.changedLocked()
	}
	s.standby = errors.Is(err, errSlotBusy)
	if err != nil && !s.standby && isFatal(err) {
		s.fatal = err
	} else if err == nil || s.standby {
		s.fatal = nil
	}
	s.recvCond.Broadcast()
}

// isFatal reports errors that need an operator (a setting, the slot lost):
// Hold returns them so that the relay says so every round.
func isFatal(err error) bool {
	var ce *walConfigError
	return errors.Is(err, ErrSlotLost) || errors.As(err, &ce)
}

// walConfigError is a problem found by the start-up check.
type walConfigError struct{ err error }

func (e *walConfigError) Error() string { return e.err.Error() }
func (e *walConfigError) Unwrap() error { return e.err }

// stream takes the slot and reads from it until ctx ends (graceful: the
// settled position is confirmed) or the connection fails.
func (s *WALStore) stream(ctx context.Context) error {
	p, err := s.Partitions(ctx)
	if err != nil {
		return err
	}
	c, err := s.readServer(ctx)
	if err != nil {
		return err
	}
	if err := s.problem(c); err != nil {
		return &walConfigError{err}
	}
	if c.slot.active {
		return errSlotBusy
	}
	if !c.slot.exists {
		if err := s.ensureSlot(ctx, c); err != nil {
			return &walConfigError{err}
		}
	}
	connectCtx, cancel := context.WithTimeout(ctx, s.w.Timeout)
	conn, err := pgconn.ConnectConfig(connectCtx, s.repl)
	cancel()
	if err != nil {
		return fmt.Errorf("postgres: open the replication connection: %w", err)
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_ = conn.Close(cctx)
		cancel()
	}()
	startCtx, cancel := context.WithTimeout(ctx, s.w.Timeout)
	err = pglogrepl.StartReplication(startCtx, conn, s.w.Slot, 0, pglogrepl.StartReplicationOptions{
		Mode: pglogrepl.LogicalReplication,
		PluginArgs: []string{
			"proto_version '1'",
			"publication_names '" + s.w.Publication + "'", // validated: [a-z0-9_]
			"messages 'true'",
		},
	})
	cancel()
	if err != nil {
		var pe *pgconn.PgError
		if errors.As(err, &pe) && pe.Code == "55006" { // object_in_use: another relay holds it
			return errSlotBusy
		}
		if errors.As(err, &pe) && strings.Contains(pe.Message, "invalidated") {
			return fmt.Errorf("postgres: slot %q: %w: %v", s.w.Slot, ErrSlotLost, err)
		}
		return fmt.Errorf("postgres: start streaming from slot %q: %w", s.w.Slot, err)
	}
	// The slot is ours: nobody can move its confirmed position any more.
	var confirmed string
	err = s.tab.pool.QueryRow(ctx, `SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = $1`, s.w.Slot).Scan(&confirmed)
	if err != nil {
		return wrapErr("read the slot's confirmed position", s.opts, err)
	}
	start, err := pglogrepl.ParseLSN(confirmed)
	if err != nil {
		return fmt.Errorf("postgres: slot %q: confirmed_flush_lsn %q: %w", s.w.Slot, confirmed, err)
	}
	// Parked copies of what the slot streams again are duplicates: drop
	// them, the stream brings the messages back.
	if err := s.dropRestreamed(ctx, start); err != nil {
		return err
	}
	// What is parked comes before what the slot streams from start: the
	// Seqs given from now on follow the highest parked one.
	park, parkedSeq, err := s.loadParked(ctx, p)
	if err != nil {
		return err
	}
	s.mu.Lock()
	if s.buf == nil || s.buf.p != p {
		s.buf = newWALBuffer(p, start)
	} else {
		s.buf.reset(start)
	}
	s.buf.seq = max(s.buf.seq, parkedSeq)
	s.park = park
	s.active, s.standby, s.fatal = true, false, nil
	s.epochs++
	s.assignLocked()
	s.recv = max(s.recv, start)
	s.recvCond.Broadcast()
	log := s.log
	s.mu.Unlock()
	log.Info("streaming from the replication slot", "slot", s.w.Slot, "from", start, "acquisition", s.epochs)
	return s.readLoop(ctx, conn)
}

// readLoop reads the stream. It stops reading while the buffer is full,
// still confirming on schedule so that the server keeps the connection.
func (s *WALStore) readLoop(ctx context.Context, conn *pgconn.PgConn) error {
	lastRecv := time.Now()
	var nextStatus time.Time // zero: now
	var deadline time.Time   // the connection's read deadline
	var sent pglogrepl.LSN
	var fullSince, parkErrLogged time.Time // the buffer full since; parking's last error logged
	// A stop interrupts a read in progress (unless the final handshake
	// has begun, which sets its own deadline).
	var finishMu sync.Mutex
	finishing := false
	stopRead := context.AfterFunc(ctx, func() {
		finishMu.Lock()
		defer finishMu.Unlock()
		if !finishing {
			_ = conn.Conn().SetReadDeadline(time.Now())
		}
	})
	defer stopRead()
	status := func(reply bool) error {
		s.mu.Lock()
		pos := s.buf.confirmed
		s.mu.Unlock()
		err := pglogrepl.SendStandbyStatusUpdate(ctx, conn, pglogrepl.StandbyStatusUpdate{WALWritePosition: pos, ReplyRequested: reply})
		if err != nil {
			return fmt.Errorf("postgres: send the confirmed position: %w", err)
		}
		sent = pos
		s.statusSent.Add(1)
		nextStatus = time.Now().Add(s.w.StatusInterval)
		return nil
	}
	for {
		if ctx.Err() != nil {
			// Graceful stop: confirm what is settled, then end the
			// stream, reading what the server still sends until it
			// agrees, so that the confirmation cannot be lost to a
			// reset connection (closing a socket with unread data
			// resets it, and the server drops what it has not read).
			if err := status(false); err != nil {
				return err
			}
			finishMu.Lock()
			finishing = true
			_ = conn.Conn().SetDeadline(time.Now().Add(s.w.Timeout))
			finishMu.Unlock()
			if _, err := pglogrepl.SendStandbyCopyDone(context.Background(), conn); err != nil {
				return fmt.Errorf("postgres: end the replication stream after confirming %s: %w", sent, err)
			}
			s.logger().Info("released the replication slot", "slot", s.w.Slot, "confirmed", sent)
			return nil
		}
		if !time.Now().Before(nextStatus) {
			// Reply requested: the server answers with a keepalive,
			// which both shows the connection alive and, with nothing
			// pending, moves the confirmed position on.
			if err := status(true); err != nil {
				return err
			}
		}
		s.mu.Lock()
		full := s.buf.full(s.w.BufferMessages, s.w.BufferBytes)
		s.mu.Unlock()
		if full {
			s.mu.Lock()
			s.wakeLocked() // a transaction larger than the buffer: publish what is held
			s.mu.Unlock()
			// Messages held too long (a blocked destination, a key
			// waiting for its retries) leave memory for the parked
			// table, so that capture goes on for everything else.
			if fullSince.IsZero() {
				fullSince = time.Now()
			}
			parked, due, err := s.parkStale(ctx, fullSince)
			if err != nil {
				if ctx.Err() != nil {
					continue
				}
				if time.Since(parkErrLogged) >= parkLogEvery {
					parkErrLogged = time.Now()
					s.logger().Warn("could not park the messages held in the full WAL buffer; capture waits for room", "slot", s.w.Slot, "err", err)
				}
			}
			if parked > 0 {
				s.logParked(parked)
				continue
			}
			wait := time.Until(nextStatus)
			if !due.IsZero() {
				wait = min(wait, time.Until(due))
			}
			t := time.NewTimer(max(wait, time.Millisecond))
			select {
			case <-s.room:
			case <-t.C:
			case <-ctx.Done():
			}
			t.Stop()
			lastRecv = time.Now() // silent because we do not read
			continue
		}
		fullSince = time.Time{}
		if time.Since(lastRecv) > s.w.Timeout {
			return fmt.Errorf("postgres: no message from the server for %v (Options.WAL.Timeout): the connection is considered lost", s.w.Timeout)
		}
		// The read ends by the next status update at the latest: a
		// deadline on the connection, set when it changes (a context per
		// read costs more than decoding the message).
		if !deadline.Equal(nextStatus) {
			deadline = nextStatus
			_ = conn.Conn().SetReadDeadline(deadline)
			if ctx.Err() != nil {
				continue // the stop's deadline was overwritten: stop now
			}
		}
		msg, err := conn.ReceiveMessage(context.Background())
		if err != nil {
			if ctx.Err() != nil || pgconn.Timeout(err) {
				deadline = time.Time{} // set it again, the stop's may be on
				continue
			}
			return fmt.Errorf("postgres: read the replication stream: %w", err)
		}
		lastRecv = time.Now()
		switch m := msg.(type) {
		case *pgproto3.CopyData:
			reply, err := s.handle(m.Data)
			if err != nil {
				return err
			}
			if reply {
				if err := status(false); err != nil {
					return err
				}
			}
		case *pgproto3.ErrorResponse:
			return fmt.Errorf("postgres: replication stream: %w", pgconn.ErrorResponseToPgError(m))
		case *pgproto3.CopyDone:
			return errors.New("postgres: the server ended the replication stream")
		}
	}
}

// handle applies one CopyData message of the stream and reports whether
// the server asked for a reply.
func (s *WALStore) handle(data []byte) (reply bool, err error) {
	if len(data) == 0 {
		return false, nil
	}
	switch data[0] {
	case pglogrepl.PrimaryKeepaliveMessageByteID:
		k, err := pglogrepl.ParsePrimaryKeepaliveMessage(data[1:])
		if err != nil {
			return false, fmt.Errorf("postgres: replication stream: %w", err)
		}
		s.keepalives.Add(1)
		s.mu.Lock()
		s.buf.keepalive(k.ServerWALEnd)
		s.received(k.ServerWALEnd)
		s.mu.Unlock()
		return k.ReplyRequested, nil
	case pglogrepl.XLogDataByteID:
		x, err := pglogrepl.ParseXLogData(data[1:])
		if err != nil {
			return false, fmt.Errorf("postgres: replication stream: %w", err)
		}
		return false, s.handleXLog(x)
	}
	return false, nil
}

// received records that everything committed before lsn was received.
// s.mu held.
func (s *WALStore) received(lsn pglogrepl.LSN) {
	if lsn > s.recv {
		s.recv = lsn
		s.recvCond.Broadcast()
	}
}

func (s *WALStore) handleXLog(x pglogrepl.XLogData) error {
	if len(x.WALData) == 0 {
		return nil
	}
	msg, err := pglogrepl.Parse(x.WALData)
	if err != nil {
		if strings.Contains(err.Error(), "not supported") {
			return nil // a message type of no interest to a table-less publication
		}
		return fmt.Errorf("postgres: decode pgoutput: %w", err)
	}
	switch m := msg.(type) {
	case *pglogrepl.BeginMessage:
		s.mu.Lock()
		s.buf.begin(m.FinalLSN, m.CommitTime)
		s.mu.Unlock()
	case *pglogrepl.LogicalDecodingMessage:
		if m.Prefix != s.prefix {
			return nil // another producer's message
		}
		if !m.Transactional {
			s.logger().Warn("ignoring a non-transactional logical message with the outbox prefix: outbox messages are emitted inside the writing transaction", "prefix", m.Prefix, "lsn", m.LSN)
			return nil
		}
		rec, derr := decodeWALMessage(m.Content)
		decodeErr := ""
		if derr != nil {
			decodeErr = fmt.Sprintf("postgres: logical message at %s: %v", m.LSN, derr)
			rec = undecodable(rec, m.Content, m.LSN)
		}
		s.mu.Lock()
		p := s.buf.add(rec, decodeErr)
		if p >= 0 {
			s.notifyLocked(p)
		}
		s.mu.Unlock()
		if p < 0 {
			s.logger().Warn("dropped a captured message whose ID is held already (delivered under that ID)", "id", rec.ID, "lsn", m.LSN)
		}
	case *pglogrepl.CommitMessage:
		s.mu.Lock()
		s.wakeLocked()
		s.buf.commit(m.TransactionEndLSN)
		s.received(m.TransactionEndLSN)
		s.mu.Unlock()
	}
	return nil
}

// undecodable makes a message that can be dead-lettered of what could be
// decoded of a logical message: a valid ID (derived from its position if
// none could be read), text the dead-letter table can hold, and the raw
// content as payload when the payload itself could not be read.
func undecodable(m outbox.Message, content []byte, lsn pglogrepl.LSN) outbox.Message {
	if outbox.ValidateID(m.ID) != nil {
		var u [16]byte
		copy(u[:], "outbox-wal")
		for i := range 8 {
			u[8+i] = byte(uint64(lsn) >> (56 - 8*i))
		}
		u[6] = u[6]&0x0f | 0x80 // version 8: custom
		u[8] = u[8]&0x3f | 0x80
		m.ID = uuid.Format(u)
	}
	clean := func(s string) string {
		if !utf8.ValidString(s) || strings.IndexByte(s, 0) >= 0 {
			return strings.ToValidUTF8(strings.ReplaceAll(s, "\x00", ""), "\uFFFD")
		}
		return s
	}
	m.Topic, m.Key = clean(m.Topic), clean(m.Key)
	for k, v := range m.Headers {
		if ck, cv := clean(k), clean(v); ck != k || cv != v {
			delete(m.Headers, k)
			m.Headers[ck] = cv
		}
	}
	if m.Payload == nil {
		m.Payload = append([]byte{}, content...)
	}
	if m.CreatedAt.IsZero() {
		m.CreatedAt = time.Now()
	}
	return m
}
