package outbox

import "context"

// PublishTracer traces the relay's publishes for distributed tracing:
// package tracing/otel implements it with OpenTelemetry producer spans.
// Set it as [Config.Tracer]; a nil Tracer traces nothing and costs nothing.
//
// The relay calls StartPublish before each Publish call with the records
// about to be published, from its publishing goroutines, concurrently.
// StartPublish returns the messages to hand to the publisher in their
// place, one per record in the same order: the records' own messages, or
// copies carrying other headers (the context of a span that the consumer
// continues). It must not modify the records, which the relay keeps for
// retries. The relay calls end once with the publish results, one per
// message (nil for a message the broker acknowledged). Neither may block.
type PublishTracer interface {
	StartPublish(ctx context.Context, recs []*Record) (msgs []*Message, end func(errs []error))
}

// send publishes msgs (those of recs) through the publisher, traced by
// Config.Tracer when there is one, and returns one result per message.
func (r *Relay) send(ctx context.Context, recs []*Record, msgs []*Message) []error {
	t := r.cfg.Tracer
	if t == nil {
		return fixErrs(r.pub.Publish(ctx, msgs), len(msgs))
	}
	traced, end := t.StartPublish(ctx, recs)
	if len(traced) != len(msgs) {
		traced = msgs // a tracer that broke its contract does not lose messages
	}
	errs := fixErrs(r.pub.Publish(ctx, traced), len(msgs))
	if end != nil {
		end(errs)
	}
	return errs
}
