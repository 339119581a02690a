package natsjs

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/outboxrelay/outbox"
)

// JetStream API error codes that retrying cannot fix (nats-server's
// errors.json).
const (
	errCodeMessageExceedsMaximum = 10054 // larger than the stream's max_msg_size
	errCodeStreamStoreFailed     = 10077 // a store error; permanent only if "message too large"
	errCodeHeaderExceedsMaximum  = 10097
	errCodeStreamSealed          = 10109
)

// lookupTimeout bounds the stream lookup that tells a missing stream from a
// stream that did not answer.
const lookupTimeout = 2 * time.Second

// noStreamError is the provisional result of a publish that found no
// responder on its subject; resolveNoStream replaces it after looking for a
// stream that covers the subject.
type noStreamError struct {
	subject string
	err     error
}

func (e *noStreamError) Error() string {
	return fmt.Sprintf("natsjs: publish to %q: no stream answered: %v", e.subject, e.err)
}
func (e *noStreamError) Unwrap() error { return e.err }

// classify wraps err, the failure to publish m to subject, marking with
// outbox.Permanent what retrying cannot fix.
func classify(subject string, m *outbox.Message, err error) error {
	var apiErr *jetstream.APIError
	switch {
	case errors.Is(err, jetstream.ErrNoStreamResponse), errors.Is(err, nats.ErrNoResponders):
		return &noStreamError{subject: subject, err: err}
	case errors.Is(err, nats.ErrMaxPayload):
		return outbox.Permanent(fmt.Errorf("natsjs: publish to %q: the message (payload %d bytes, plus headers) exceeds the server's max_payload: shrink it or raise max_payload in the server configuration: %w",
			subject, len(m.Payload), err))
	case errors.Is(err, nats.ErrBadSubject):
		return outbox.Permanent(fmt.Errorf("natsjs: publish to %q: invalid subject: %w", subject, err))
	case errors.As(err, &apiErr):
		switch apiErr.ErrorCode {
		case errCodeMessageExceedsMaximum, errCodeHeaderExceedsMaximum:
			return outbox.Permanent(fmt.Errorf("natsjs: publish to %q: the message (payload %d bytes, plus headers) exceeds the stream's limit: shrink it or raise the stream's max_msg_size: %w",
				subject, len(m.Payload), err))
		case errCodeStreamSealed:
			return outbox.Permanent(fmt.Errorf("natsjs: publish to %q: the stream is sealed and accepts no messages: %w", subject, err))
		case errCodeStreamStoreFailed:
			if strings.Contains(apiErr.Description, "message too large") {
				return outbox.Permanent(fmt.Errorf("natsjs: publish to %q: the message (payload %d bytes) is too large for the stream's store: %w", subject, len(m.Payload), err))
			}
		}
	}
	return fmt.Errorf("natsjs: publish to %q: %w", subject, err)
}

// resolveNoStream replaces each provisional noStreamError by a permanent
// error if no stream covers the subject (or JetStream is off), and by a
// retryable one if a stream does (a leader election, say) or the lookup
// fails. It looks up each subject once.
func (p *Publisher) resolveNoStream(ctx context.Context, errs []error) {
	resolved := map[string]error{}
	for i, err := range errs {
		var ns *noStreamError
		if err == nil || !errors.As(err, &ns) {
			continue
		}
		r, ok := resolved[ns.subject]
		if !ok {
			r = p.lookupStream(ctx, ns)
			resolved[ns.subject] = r
		}
		errs[i] = r
	}
}

func (p *Publisher) lookupStream(ctx context.Context, ns *noStreamError) error {
	if ctx.Err() != nil {
		return fmt.Errorf("%w (could not check whether a stream covers it: %w)", ns, context.Cause(ctx))
	}
	ctx, cancel := context.WithTimeout(ctx, lookupTimeout)
	defer cancel()
	name, err := p.js.StreamNameBySubject(ctx, ns.subject)
	switch {
	case err == nil:
		return fmt.Errorf("natsjs: publish to %q: stream %q covers the subject but did not answer (leader election?): %w", ns.subject, name, ns.err)
	case errors.Is(err, jetstream.ErrStreamNotFound):
		return outbox.Permanent(fmt.Errorf("natsjs: publish to %q: no JetStream stream covers this subject: create a stream whose subjects include it (for example `nats stream add --subjects %q`): %w",
			ns.subject, ns.subject, ns.err))
	case errors.Is(err, nats.ErrNoResponders), errors.Is(err, jetstream.ErrJetStreamNotEnabled), errors.Is(err, jetstream.ErrJetStreamNotEnabledForAccount):
		return outbox.Permanent(fmt.Errorf("natsjs: publish to %q: JetStream is not enabled on the server or for this account (%v): enable it and create a stream covering the subject: %w",
			ns.subject, err, ns.err))
	default:
		return fmt.Errorf("%w (could not check whether a stream covers it: %w)", ns, err)
	}
}
