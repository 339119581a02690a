package outbox

import "context"

// HeaderInjector adds to a message's headers, when a store writes it, what
// the context of the write carries for the message's consumers: the trace
// context of the writing span (package tracing/otel provides one with the
// W3C traceparent and tracestate headers, or any OpenTelemetry
// propagator). The stores' Write functions call it, when their options
// hold one, once per message with the ctx of Write, before validating the
// message.
//
// It returns headers itself when it has nothing to add (and should then
// not allocate), else a new map holding headers and the additions. It never
// modifies headers, which belong to the caller. It is called concurrently.
type HeaderInjector func(ctx context.Context, headers map[string]string) map[string]string
