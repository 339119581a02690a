package cli

import (
	"context"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/pflag"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"

	"github.com/outboxrelay/outbox"
	"github.com/outboxrelay/outbox/internal/buildinfo"
	"github.com/outboxrelay/outbox/internal/redact"
	outboxtrace "github.com/outboxrelay/outbox/tracing/otel"
)

// Tracing: `outbox relay` exports its producer spans (one per message
// published, a child of the writer's span whose context the message
// carries; see package tracing/otel) over OTLP when an endpoint is
// configured, the way OpenTelemetry users configure any program:
//
//   - the standard variables OTEL_EXPORTER_OTLP_ENDPOINT,
//     OTEL_EXPORTER_OTLP_TRACES_ENDPOINT, OTEL_EXPORTER_OTLP_(TRACES_)PROTOCOL,
//     OTEL_EXPORTER_OTLP_(TRACES_)HEADERS, OTEL_SERVICE_NAME,
//     OTEL_RESOURCE_ATTRIBUTES, OTEL_TRACES_SAMPLER(_ARG),
//     OTEL_TRACES_EXPORTER (otlp or none), OTEL_PROPAGATORS (tracecontext,
//     baggage, none) and OTEL_SDK_DISABLED;
//   - the flags --otel-endpoint, --otel-protocol, --otel-headers,
//     --otel-service-name, --otel-sampler, --otel-sampler-arg (and so their
//     OUTBOX_OTEL_… variables and config-file keys), which take precedence
//     over the standard variables, as code does over the environment in
//     the OpenTelemetry SDKs.
//
// Off unless an endpoint is given (or OTEL_TRACES_EXPORTER=otlp, which
// means the default endpoint); OTEL_SDK_DISABLED=true or
// OTEL_TRACES_EXPORTER=none turn it off whatever else is set. Headers
// (usually an authentication token) are never printed or logged.

// Defaults of the tracing settings.
const (
	otelServiceNameDefault  = "outbox-relay"
	otelProtocolGRPC        = "grpc"
	otelProtocolHTTP        = "http/protobuf"
	otelHTTPEndpointDefault = "http://localhost:4318"
	otelGRPCEndpointDefault = "http://localhost:4317"
	otelShutdownTimeout     = 5 * time.Second
)

var otelSamplers = []string{"always_on", "always_off", "traceidratio", "parentbased_always_on", "parentbased_always_off", "parentbased_traceidratio"}

// otelFlags are the relay's tracing flags.
type otelFlags struct {
	endpoint    string
	protocol    string
	headers     string
	serviceName string
	sampler     string
	samplerArg  string
}

func (o *otelFlags) add(fs *pflag.FlagSet) {
	fs.StringVar(&o.endpoint, "otel-endpoint", "", "export the relay's spans over OTLP to this URL, such as http://collector:4318 (http/protobuf: spans go to its /v1/traces) or http://collector:4317 (grpc); default OTEL_EXPORTER_OTLP_TRACES_ENDPOINT or OTEL_EXPORTER_OTLP_ENDPOINT; none: no export")
	fs.StringVar(&o.protocol, "otel-protocol", "", "OTLP protocol: http/protobuf or grpc (default OTEL_EXPORTER_OTLP_TRACES_PROTOCOL, OTEL_EXPORTER_OTLP_PROTOCOL, else http/protobuf)")
	fs.StringVar(&o.headers, "otel-headers", "", "headers sent with every OTLP export, key=value pairs separated by commas, values URL-encoded (an auth token); default OTEL_EXPORTER_OTLP_TRACES_HEADERS or OTEL_EXPORTER_OTLP_HEADERS; never printed")
	fs.StringVar(&o.serviceName, "otel-service-name", "", "service.name of the exported spans (default OTEL_SERVICE_NAME, else "+otelServiceNameDefault+")")
	fs.StringVar(&o.sampler, "otel-sampler", "", "which spans to keep: "+strings.Join(otelSamplers, ", ")+" (default OTEL_TRACES_SAMPLER, else parentbased_always_on: the writer's decision, all for messages written without a trace)")
	fs.StringVar(&o.samplerArg, "otel-sampler-arg", "", "the ratio of the *traceidratio samplers, 0 to 1 (default OTEL_TRACES_SAMPLER_ARG, else 1)")
	markSecret(fs, "otel-headers")
}

// otelSettings are the resolved tracing settings.
type otelSettings struct {
	enabled     bool
	why         string // why tracing is off, for the log
	protocol    string
	endpoint    string // a URL; for http/protobuf, the full traces URL
	headers     map[string]string
	serviceName string
	resource    []attribute.KeyValue
	sampler     sdktrace.Sampler
	samplerName string
	propagator  propagation.TextMapPropagator
}

// resolve combines the flags and the standard variables. Its errors are
// usage errors naming the flag or variable to change.
func (o *otelFlags) resolve(a *app) (*otelSettings, error) {
	env := func(names ...string) (string, string) {
		for _, n := range names {
			if v, ok := a.env.LookupEnv(n); ok && strings.TrimSpace(v) != "" {
				return strings.TrimSpace(v), n
			}
		}
		return "", ""
	}
	s := &otelSettings{}
	if v, name := env("OTEL_SDK_DISABLED"); v != "" {
		disabled, err := strconv.ParseBool(v)
		if err != nil {
			return nil, usagef("%s=%q must be true or false", name, v)
		}
		if disabled {
			s.why = "OTEL_SDK_DISABLED=true"
			return s, nil
		}
	}
	exporter, _ := env("OTEL_TRACES_EXPORTER")
	switch strings.ToLower(exporter) {
	case "", "otlp":
	case "none":
		s.why = "OTEL_TRACES_EXPORTER=none"
		return s, nil
	default:
		return nil, usagef("OTEL_TRACES_EXPORTER=%q is not supported: the relay exports OTLP only (otlp, or none to turn tracing off)", exporter)
	}

	// Protocol.
	s.protocol, s.endpoint = o.protocol, o.endpoint
	protoFrom := a.flagRef("otel-protocol")
	if s.protocol == "" {
		var name string
		if s.protocol, name = env("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL"); name != "" {
			protoFrom = name
		}
	}
	switch s.protocol {
	case "":
		s.protocol = otelProtocolHTTP
	case otelProtocolHTTP, otelProtocolGRPC:
	case "http/json":
		return nil, usagef("%s: http/json is not supported by the Go OTLP exporters; use http/protobuf or grpc", protoFrom)
	default:
		return nil, usagef("%s must be http/protobuf or grpc, got %q", protoFrom, s.protocol)
	}

	// Endpoint: the flag and OTEL_EXPORTER_OTLP_ENDPOINT are base URLs
	// (http/protobuf posts to their /v1/traces), the traces variable is
	// the full URL.
	endpointFrom := a.flagRef("otel-endpoint")
	base := true
	if s.endpoint == "" {
		if v, name := env("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"); v != "" {
			s.endpoint, endpointFrom, base = v, name, false
		} else if v, name := env("OTEL_EXPORTER_OTLP_ENDPOINT"); v != "" {
			s.endpoint, endpointFrom = v, name
		}
	}
	if s.endpoint == "" {
		if exporter == "" {
			s.why = "no endpoint (set OTEL_EXPORTER_OTLP_ENDPOINT or --otel-endpoint)"
			return s, nil
		}
		s.endpoint = otelHTTPEndpointDefault
		if s.protocol == otelProtocolGRPC {
			s.endpoint = otelGRPCEndpointDefault
		}
	}
	u, err := url.Parse(s.endpoint)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, usagef("%s must be an http:// or https:// URL such as http://collector:4318, got %q", endpointFrom, redact.URL(s.endpoint))
	}
	if s.protocol == otelProtocolHTTP && base {
		u.Path = strings.TrimSuffix(u.Path, "/") + "/v1/traces"
	}
	s.endpoint = u.String()

	// Headers.
	raw, headersFrom := o.headers, a.flagRef("otel-headers")
	if raw == "" {
		raw, headersFrom = env("OTEL_EXPORTER_OTLP_TRACES_HEADERS", "OTEL_EXPORTER_OTLP_HEADERS")
	}
	if s.headers, err = parseOTelPairs(raw); err != nil {
		return nil, usagef("%s: %v (the values are not shown)", headersFrom, err)
	}

	// Resource.
	s.serviceName = o.serviceName
	if s.serviceName == "" {
		s.serviceName, _ = env("OTEL_SERVICE_NAME")
	}
	attrsRaw, _ := env("OTEL_RESOURCE_ATTRIBUTES")
	attrs, err := parseOTelPairs(attrsRaw)
	if err != nil {
		return nil, usagef("OTEL_RESOURCE_ATTRIBUTES: %v", err)
	}
	if s.serviceName == "" {
		s.serviceName = cmpOr(attrs["service.name"], otelServiceNameDefault)
	}
	for k, v := range attrs {
		if k != "service.name" {
			s.resource = append(s.resource, attribute.String(k, v))
		}
	}

	// Sampler.
	samplerFrom, argFrom := a.flagRef("otel-sampler"), a.flagRef("otel-sampler-arg")
	name, arg := o.sampler, o.samplerArg
	if name == "" {
		if v, n := env("OTEL_TRACES_SAMPLER"); v != "" {
			name, samplerFrom = v, n
		}
	}
	if arg == "" {
		if v, n := env("OTEL_TRACES_SAMPLER_ARG"); v != "" {
			arg, argFrom = v, n
		}
	}
	if s.sampler, err = otelSampler(cmpOr(name, "parentbased_always_on"), arg, samplerFrom, argFrom); err != nil {
		return nil, err
	}
	s.samplerName = cmpOr(name, "parentbased_always_on")
	if strings.HasSuffix(s.samplerName, "traceidratio") {
		s.samplerName += " " + cmpOr(arg, "1")
	}

	// Propagators: how the relay reads the writer's context from the
	// message headers and writes its own for the consumers.
	props, from := env("OTEL_PROPAGATORS")
	var ps []propagation.TextMapPropagator
	for p := range strings.SplitSeq(cmpOr(props, "tracecontext,baggage"), ",") {
		switch strings.TrimSpace(p) {
		case "tracecontext":
			ps = append(ps, propagation.TraceContext{})
		case "baggage":
			ps = append(ps, propagation.Baggage{})
		case "none", "":
		default:
			return nil, usagef("%s: propagator %q is not supported; use tracecontext, baggage or none", from, strings.TrimSpace(p))
		}
	}
	s.propagator = propagation.NewCompositeTextMapPropagator(ps...)
	s.enabled = true
	return s, nil
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// parseOTelPairs parses the W3C Baggage-like list of OTEL_EXPORTER_OTLP_HEADERS
// and OTEL_RESOURCE_ATTRIBUTES: key=value pairs separated by commas,
// values percent-encoded. Its errors never show a value.
func parseOTelPairs(s string) (map[string]string, error) {
	if strings.TrimSpace(s) == "" {
		return nil, nil
	}
	out := map[string]string{}
	for i, pair := range strings.Split(s, ",") {
		k, v, ok := strings.Cut(pair, "=")
		k = strings.TrimSpace(k)
		if !ok || k == "" {
			return nil, fmt.Errorf("entry %d is not key=value", i+1)
		}
		dv, err := url.PathUnescape(strings.TrimSpace(v))
		if err != nil {
			return nil, fmt.Errorf("the value of %q is not valid percent-encoding", k)
		}
		out[k] = dv
	}
	return out, nil
}

// otelSampler builds the sampler named by OTEL_TRACES_SAMPLER's values.
func otelSampler(name, arg, nameFrom, argFrom string) (sdktrace.Sampler, error) {
	ratio := 1.0
	if strings.HasSuffix(name, "traceidratio") && arg != "" {
		r, err := strconv.ParseFloat(arg, 64)
		if err != nil || r < 0 || r > 1 {
			return nil, usagef("%s must be a ratio between 0 and 1, got %q", argFrom, arg)
		}
		ratio = r
	}
	switch name {
	case "always_on":
		return sdktrace.AlwaysSample(), nil
	case "always_off":
		return sdktrace.NeverSample(), nil
	case "traceidratio":
		return sdktrace.TraceIDRatioBased(ratio), nil
	case "parentbased_always_on":
		return sdktrace.ParentBased(sdktrace.AlwaysSample()), nil
	case "parentbased_always_off":
		return sdktrace.ParentBased(sdktrace.NeverSample()), nil
	case "parentbased_traceidratio":
		return sdktrace.ParentBased(sdktrace.TraceIDRatioBased(ratio)), nil
	}
	return nil, usagef("%s must be one of %s, got %q", nameFrom, strings.Join(otelSamplers, ", "), name)
}

// messagingSystem names a broker URL's system for messaging.system.
func messagingSystem(brokerURL string) string {
	u, err := url.Parse(brokerURL)
	if err != nil {
		return "unknown"
	}
	switch u.Scheme {
	case "nats", "tls":
		return "nats"
	case "amqp", "amqps":
		return "rabbitmq"
	case "sqs", "sns", "kinesis":
		return "aws_" + u.Scheme
	}
	return u.Scheme
}

// startTracing makes the relay's tracer from the settings: an SDK tracer
// provider exporting in batches over OTLP. shutdown flushes the spans
// still buffered (bounded by otelShutdownTimeout); call it after the relay
// stopped.
func (a *app) startTracing(ctx context.Context, s *otelSettings, system string) (outbox.PublishTracer, func(), error) {
	var exp *otlptrace.Exporter
	var err error
	switch s.protocol {
	case otelProtocolGRPC:
		opts := []otlptracegrpc.Option{otlptracegrpc.WithEndpointURL(s.endpoint)}
		if len(s.headers) > 0 {
			opts = append(opts, otlptracegrpc.WithHeaders(s.headers))
		}
		exp, err = otlptracegrpc.New(ctx, opts...)
	default:
		opts := []otlptracehttp.Option{otlptracehttp.WithEndpointURL(s.endpoint)}
		if len(s.headers) > 0 {
			opts = append(opts, otlptracehttp.WithHeaders(s.headers))
		}
		exp, err = otlptracehttp.New(ctx, opts...)
	}
	if err != nil {
		return nil, nil, fmt.Errorf("tracing: OTLP exporter for %s: %w", redact.URL(s.endpoint), err)
	}
	attrs := append([]attribute.KeyValue{
		semconv.ServiceName(s.serviceName),
		semconv.ServiceVersion(buildinfo.Read().Version),
	}, s.resource...)
	tp := sdktrace.NewTracerProvider(
		sdktrace.WithBatcher(exp),
		sdktrace.WithSampler(s.sampler),
		sdktrace.WithResource(resource.NewWithAttributes(semconv.SchemaURL, attrs...)),
	)
	// Export failures reach the SDK's global error handler: log them
	// (they name the endpoint, never the headers).
	log := a.log
	otel.SetErrorHandler(otel.ErrorHandlerFunc(func(err error) { log.Warn("tracing: export failed", "err", err) }))
	a.log.Info("tracing: exporting spans over OTLP", "protocol", s.protocol, "endpoint", redact.URL(s.endpoint),
		"service", s.serviceName, "sampler", s.samplerName, "headers", len(s.headers))
	tracer := outboxtrace.NewPublishTracer(system, outboxtrace.WithTracerProvider(tp), outboxtrace.WithPropagator(s.propagator))
	return tracer, func() {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), otelShutdownTimeout)
		defer cancel()
		if err := tp.Shutdown(sctx); err != nil {
			a.log.Warn("tracing: flush spans", "err", err)
		}
	}, nil
}
