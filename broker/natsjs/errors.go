package natsjs

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/outboxrelay/outbox"
)

// JetStream API error codes (nats-server's errors.json) that Publish
// classifies.
const (
	errCodeAccountResourcesExceeded = 10002 // the account's JetStream limits
	errCodeInsufficientResources    = 10023
	errCodeStorageResourcesExceeded = 10047
	errCodeMemoryResourcesExceeded  = 10028
	errCodeMessageExceedsMaximum    = 10054 // larger than the stream's max_msg_size
	errCodeStreamStoreFailed        = 10077 // a store error: full with DiscardNew, "message too large", ...
	errCodeHeaderExceedsMaximum     = 10097
	errCodeStreamSealed             = 10109
)

// lookupTimeout bounds the stream lookup that tells a missing stream from a
// stream that did not answer.
const lookupTimeout = 2 * time.Second

// noStreamError is the provisional result of a publish that found no
// responder on its subject; resolveNoStream replaces it after looking for a
// stream that covers the subject.
type noStreamError struct {
	subject string
	topic   string
	err     error
}

func (e *noStreamError) Error() string {
	return fmt.Sprintf("natsjs: publish to %q: no stream answered: %v", e.subject, e.err)
}
func (e *noStreamError) Unwrap() error { return e.err }

// classify wraps err, the failure to publish m to subject: permanent when
// the message itself can never be stored, blocked when the destination or
// the server is unusable or the outcome unknown, else retryable.
func (p *Publisher) classify(subject string, m *outbox.Message, err error) error {
	blocked := func(format string, args ...any) error {
		return outbox.Blocked(m.Topic, p.denied.explain(subject, fmt.Errorf(format, args...)))
	}
	var apiErr *jetstream.APIError
	switch {
	case errors.Is(err, jetstream.ErrNoStreamResponse), errors.Is(err, nats.ErrNoResponders):
		return &noStreamError{subject: subject, topic: m.Topic, err: err}
	case errors.Is(err, nats.ErrMaxPayload):
		return outbox.Permanent(fmt.Errorf("natsjs: publish to %q: the message (payload %d bytes, plus headers) exceeds the server's max_payload: shrink it or raise max_payload in the server configuration (and the store's MaxPayload): %w",
			subject, len(m.Payload), err))
	case errors.Is(err, nats.ErrBadSubject):
		return outbox.Permanent(fmt.Errorf("natsjs: publish to %q: invalid subject: %w", subject, err))
	case errors.Is(err, nats.ErrReconnectBufExceeded), errors.Is(err, nats.ErrConnectionReconnecting):
		return blocked("natsjs: publish to %q: not sent: the connection to the NATS server is down (reconnecting): %w", subject, err)
	case errors.Is(err, nats.ErrDisconnected):
		return blocked("natsjs: publish to %q: the connection to the NATS server was lost before the acknowledgement (the message may be stored): %w", subject, err)
	case errors.Is(err, jetstream.ErrAsyncPublishTimeout), errors.Is(err, nats.ErrTimeout):
		return blocked("natsjs: publish to %q: no acknowledgement in time (the message may be stored): %w", subject, err)
	case errors.Is(err, jetstream.ErrTooManyStalledMsgs):
		return blocked("natsjs: publish to %q: not sent: too many acknowledgements outstanding: %w", subject, err)
	case errors.Is(err, nats.ErrPermissionViolation), errors.Is(err, nats.ErrAuthorization):
		return blocked("natsjs: publish to %q: not authorised: grant the user publish permission on the subject (and subscribe permission on its reply inbox): %w", subject, err)
	case errors.As(err, &apiErr):
		switch apiErr.ErrorCode {
		case errCodeMessageExceedsMaximum, errCodeHeaderExceedsMaximum:
			return outbox.Permanent(fmt.Errorf("natsjs: publish to %q: the message (payload %d bytes, headers %d bytes) exceeds the stream's limit (max_msg_size, or JetStream's fixed 64 KiB of headers): shrink it, or raise the stream's max_msg_size: %w",
				subject, len(m.Payload), m.HeaderBytes(), err))
		case errCodeStreamSealed:
			return blocked("natsjs: publish to %q: the stream is sealed and accepts no messages: delete and recreate it, or map the topic to another stream: %w", subject, err)
		case errCodeStreamStoreFailed:
			if strings.Contains(apiErr.Description, "message too large") {
				return outbox.Permanent(fmt.Errorf("natsjs: publish to %q: the message (payload %d bytes) is too large for the stream's store: %w", subject, len(m.Payload), err))
			}
			// "maximum messages exceeded", "maximum bytes exceeded", "maximum
			// messages per subject exceeded" (a full stream with DiscardNew),
			// or the store failing: the stream, not the message.
			return blocked("natsjs: publish to %q: the stream refused the message: %w; if it is full (DiscardNew), raise its limits or let consumers catch up", subject, err)
		case errCodeAccountResourcesExceeded, errCodeInsufficientResources, errCodeStorageResourcesExceeded, errCodeMemoryResourcesExceeded:
			return blocked("natsjs: publish to %q: JetStream is out of resources: %w", subject, err)
		}
	}
	return fmt.Errorf("natsjs: publish to %q: %w", subject, err)
}

// resolveNoStream replaces each provisional noStreamError by a blocked
// error that says why no stream answered: none covers the subject,
// JetStream is not enabled, or the stream covering it did not answer (a
// leader election). It looks up each subject once.
func (p *Publisher) resolveNoStream(ctx context.Context, errs []error) {
	resolved := map[string]error{}
	for i, err := range errs {
		var ns *noStreamError
		if err == nil || !errors.As(err, &ns) {
			continue
		}
		r, ok := resolved[ns.subject]
		if !ok {
			r = outbox.Blocked(ns.topic, p.lookupStream(ctx, ns))
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
		return fmt.Errorf("natsjs: publish to %q: no JetStream stream covers this subject: create a stream whose subjects include it (outbox destinations create --broker URL --stream-subjects %q, or jetstream.CreateStream in Go): %w",
			ns.subject, ns.subject, ns.err)
	case errors.Is(err, nats.ErrNoResponders), errors.Is(err, jetstream.ErrJetStreamNotEnabled), errors.Is(err, jetstream.ErrJetStreamNotEnabledForAccount):
		return fmt.Errorf("natsjs: publish to %q: JetStream is not enabled on the server or for this account (%v): enable it and create a stream covering the subject: %w",
			ns.subject, err, ns.err)
	default:
		return fmt.Errorf("%w (could not check whether a stream covers it: %w)", ns, err)
	}
}

// unaltered reports an error if NATS would alter m's key or a header value:
// nats.go trims leading and trailing spaces and tabs from header values
// and replaces CR and LF. Message.Validate refuses such messages at Write;
// this catches rows written otherwise, which would reach consumers changed.
func unaltered(m *outbox.Message) error {
	if alteredByNATS(m.Key) {
		return fmt.Errorf("its key %q would reach NATS altered (a header value cannot hold CR or LF, nor start or end with a space or tab); Write refuses such keys: was the message written without the store's Write?", m.Key)
	}
	for k, v := range m.Headers {
		if alteredByNATS(v) {
			return fmt.Errorf("the value %q of header %q would reach NATS altered (a header value cannot hold CR or LF, nor start or end with a space or tab); Write refuses such values: was the message written without the store's Write?", v, k)
		}
	}
	return nil
}

func alteredByNATS(v string) bool {
	if v == "" {
		return false
	}
	isSpace := func(c byte) bool { return c == ' ' || c == '\t' }
	return strings.ContainsAny(v, "\r\n") || isSpace(v[0]) || isSpace(v[len(v)-1])
}

// permissionSubject finds the subject in nats.go's permission violation
// error: `nats: permissions violation: Permissions Violation for Publish to
// "subject"`.
var permissionSubject = regexp.MustCompile(`(?i)for publish to "([^"]+)"`)

// maxDenials bounds the subjects remembered by denials.
const maxDenials = 1024

// denials remembers the subjects the server refused publishes to for lack
// of permission (reported asynchronously, to the connection's error
// handler): such a publish is dropped by the server and its acknowledgement
// only times out, so the timeout's error says why.
type denials struct {
	n    atomic.Int32 // len(subj), read without the lock
	mu   sync.Mutex
	subj map[string]error
}

// note records err if it is a publish permission violation.
func (d *denials) note(err error) {
	if !errors.Is(err, nats.ErrPermissionViolation) {
		return
	}
	m := permissionSubject.FindStringSubmatch(err.Error())
	if m == nil {
		return
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.subj == nil {
		d.subj = map[string]error{}
	}
	if len(d.subj) < maxDenials {
		d.subj[m[1]] = err
		d.n.Store(int32(len(d.subj)))
	}
}

// clear forgets a denial of subject, once a publish to it succeeded.
func (d *denials) clear(subject string) {
	if d.n.Load() == 0 {
		return
	}
	d.mu.Lock()
	delete(d.subj, subject)
	d.n.Store(int32(len(d.subj)))
	d.mu.Unlock()
}

// explain adds to err the permission violation the server reported for
// subject, if any.
func (d *denials) explain(subject string, err error) error {
	if d.n.Load() == 0 {
		return err
	}
	d.mu.Lock()
	denial := d.subj[subject]
	d.mu.Unlock()
	if denial == nil {
		return err
	}
	return fmt.Errorf("%w; the server reported %w: grant the user publish permission on the subject", err, denial)
}
