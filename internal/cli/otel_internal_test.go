package cli

import (
	"testing"
)

// TestOTelResolve: which settings win, when tracing is off, and the
// standard variables' endpoint rules (the base URL gets /v1/traces for
// http/protobuf, the traces URL is used as it is).
func TestOTelResolve(t *testing.T) {
	for _, tc := range []struct {
		name     string
		flags    otelFlags
		vars     map[string]string
		enabled  bool
		protocol string
		endpoint string
		service  string
		sampler  string
	}{
		{name: "nothing set", enabled: false},
		{name: "disabled", vars: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_SDK_DISABLED": "true"}, enabled: false},
		{name: "exporter none", flags: otelFlags{endpoint: "http://c:4318"}, vars: map[string]string{"OTEL_TRACES_EXPORTER": "none"}, enabled: false},
		{name: "base endpoint", vars: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318/"}, enabled: true,
			protocol: "http/protobuf", endpoint: "http://c:4318/v1/traces", service: "outbox-relay", sampler: "parentbased_always_on"},
		{name: "traces endpoint as is", vars: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://other:4318", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "https://c/custom"}, enabled: true,
			protocol: "http/protobuf", endpoint: "https://c/custom", service: "outbox-relay", sampler: "parentbased_always_on"},
		{name: "grpc keeps the URL", vars: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4317", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "grpc", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf"}, enabled: true,
			protocol: "grpc", endpoint: "http://c:4317", service: "outbox-relay", sampler: "parentbased_always_on"},
		{name: "exporter otlp means the default endpoint", vars: map[string]string{"OTEL_TRACES_EXPORTER": "otlp"}, enabled: true,
			protocol: "http/protobuf", endpoint: "http://localhost:4318/v1/traces", service: "outbox-relay", sampler: "parentbased_always_on"},
		{name: "flags beat the variables",
			flags:   otelFlags{endpoint: "http://mine:4318", serviceName: "orders-relay", sampler: "traceidratio", samplerArg: "0.01"},
			vars:    map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://theirs:4318", "OTEL_SERVICE_NAME": "x", "OTEL_TRACES_SAMPLER": "always_off"},
			enabled: true, protocol: "http/protobuf", endpoint: "http://mine:4318/v1/traces", service: "orders-relay", sampler: "traceidratio 0.01"},
		{name: "service from resource attributes", vars: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_RESOURCE_ATTRIBUTES": "service.name=billing,deployment.environment=prod"}, enabled: true,
			protocol: "http/protobuf", endpoint: "http://c:4318/v1/traces", service: "billing", sampler: "parentbased_always_on"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := &app{env: Env{LookupEnv: func(k string) (string, bool) { v, ok := tc.vars[k]; return v, ok }}}
			s, err := tc.flags.resolve(a)
			if err != nil {
				t.Fatal(err)
			}
			if s.enabled != tc.enabled {
				t.Fatalf("enabled = %v (%s), want %v", s.enabled, s.why, tc.enabled)
			}
			if !s.enabled {
				return
			}
			if s.protocol != tc.protocol || s.endpoint != tc.endpoint || s.serviceName != tc.service || s.samplerName != tc.sampler {
				t.Fatalf("got %s %s %s %s; want %s %s %s %s", s.protocol, s.endpoint, s.serviceName, s.samplerName, tc.protocol, tc.endpoint, tc.service, tc.sampler)
			}
		})
	}
}
