package postgres

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
)

// Subscribe listens for the NOTIFY that Write sends on commit. It takes a
// connection out of the pool for good (the pool no longer counts it), runs
// LISTEN on it before returning, and then signals the returned channel
// (buffered, coalesced: one pending value at most) on every notification.
// The channel is closed, and the connection closed, when ctx ends, the
// connection fails, or the Store is closed. Messages written with Notify
// off, or by a Writer with other Schema or TablePrefix, do not signal.
func (s *Store) Subscribe(ctx context.Context) (<-chan struct{}, error) {
	if err := s.check("subscribe"); err != nil {
		return nil, err
	}
	pc, err := s.pool.Acquire(ctx)
	if err != nil {
		return nil, s.wrap("subscribe", err)
	}
	conn := pc.Hijack()
	if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{s.n.channel}.Sanitize()); err != nil {
		closeConn(conn)
		return nil, s.wrap("subscribe", err)
	}

	s.subMu.Lock()
	if s.closed.Load() {
		s.subMu.Unlock()
		closeConn(conn)
		return nil, s.check("subscribe")
	}
	s.wg.Add(1)
	s.subMu.Unlock()

	ctx, cancel := context.WithCancel(ctx)
	stop := context.AfterFunc(s.closeCtx, cancel)
	ch := make(chan struct{}, 1)
	go func() {
		defer s.wg.Done()
		defer cancel()
		defer stop()
		defer close(ch)
		defer closeConn(conn)
		for {
			if _, err := conn.WaitForNotification(ctx); err != nil {
				return
			}
			select {
			case ch <- struct{}{}:
			default: // a signal is already pending
			}
		}
	}()
	return ch, nil
}

// closeConn closes a hijacked connection, bounding the goodbye message.
func closeConn(conn *pgx.Conn) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = conn.Close(ctx)
}
