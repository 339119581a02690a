package storetest

import (
	"context"
	"maps"

	"github.com/outboxrelay/outbox"
)

type traceparentKey struct{}

// WithTraceparent returns ctx carrying v for [Inject], as a context
// carries a span for a tracing injector.
func WithTraceparent(ctx context.Context, v string) context.Context {
	return context.WithValue(ctx, traceparentKey{}, v)
}

// Inject is an outbox.HeaderInjector for testing a store's Options.Inject
// without a tracing library: it adds the value [WithTraceparent] put in ctx
// as a "traceparent" header, on a copy, and returns headers unchanged when
// ctx carries none.
var Inject outbox.HeaderInjector = func(ctx context.Context, headers map[string]string) map[string]string {
	v, _ := ctx.Value(traceparentKey{}).(string)
	if v == "" {
		return headers
	}
	out := maps.Clone(headers)
	if out == nil {
		out = map[string]string{}
	}
	out["traceparent"] = v
	return out
}
