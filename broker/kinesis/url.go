package kinesis

import (
	"fmt"
	"net/url"
	"strings"

	"github.com/outboxrelay/outbox/broker/internal/optcheck"
	"github.com/outboxrelay/outbox/internal/redact"
)

// URLParams are the query parameters ParseURL reads into Options.
var URLParams = []string{
	"region",                  // Region (or the URL's host)
	"endpoint",                // Endpoint (http://127.0.0.1:4567)
	"profile",                 // Profile
	"stream",                  // every topic to this one stream (a name or an ARN)
	"max_batch_records",       // MaxBatchRecords (1 to 500)
	"max_record_bytes",        // MaxRecordBytes
	"max_concurrent_requests", // MaxConcurrentRequests
	"publish_timeout",         // PublishTimeout (a duration: 10s)
}

// URLOptions are what ParseURL read: Options plus the one stream every
// message goes to ("" for one stream per topic).
type URLOptions struct {
	Options
	Stream string
}

// ParseURL reads a Kinesis URL, kinesis://[REGION][?param=value...], such
// as kinesis://eu-west-1?stream=orders or
// kinesis://?region=us-east-1&endpoint=http://127.0.0.1:4567: the host, if
// any, is the region (as is region=; else the AWS configuration's), and
// the parameters listed in URLParams set the matching fields. Credentials
// are never in the URL: they come from the AWS configuration chain (the
// environment, AWS_PROFILE and the shared files, web identity, the
// container or instance role). Errors name the parameter.
func ParseURL(raw string) (URLOptions, error) {
	var o URLOptions
	shown := redact.URL(raw)
	u, err := url.Parse(raw)
	if err != nil || u.Scheme != "kinesis" || u.Opaque != "" {
		return o, fmt.Errorf("kinesis: URL %q: want kinesis://[region][?endpoint=…&stream=…]", shown)
	}
	if u.User != nil {
		return o, fmt.Errorf("kinesis: URL %q holds credentials; AWS credentials come from the AWS configuration (AWS_PROFILE, AWS_SHARED_CREDENTIALS_FILE, the environment, a role), never the URL", shown)
	}
	if strings.Trim(u.Path, "/") != "" || u.Fragment != "" {
		return o, fmt.Errorf("kinesis: URL %q has a path; give the stream with ?stream= or let each topic name its stream", shown)
	}
	o.Region = u.Host
	subject := fmt.Sprintf("kinesis: URL %q", shown)
	err = optcheck.Query(u.Query(), subject, URLParams, nil, func(p optcheck.Param) error {
		var err error
		switch p.Name {
		case "region":
			if o.Region != "" && o.Region != p.Value {
				return p.Bad(fmt.Sprintf("the URL's host (%s) or absent: give the region once", o.Region))
			}
			o.Region = p.Value
		case "endpoint":
			o.Endpoint = p.Value
		case "profile":
			o.Profile = p.Value
		case "stream":
			if verr := validateStream(p.Value); verr != nil {
				return p.Bad(fmt.Sprintf("a stream name or ARN (%v)", verr))
			}
			o.Stream = p.Value
		case "max_batch_records":
			o.MaxBatchRecords, err = p.PositiveInt()
		case "max_record_bytes":
			o.MaxRecordBytes, err = p.PositiveInt()
		case "max_concurrent_requests":
			o.MaxConcurrentRequests, err = p.PositiveInt()
		case "publish_timeout":
			o.PublishTimeout, err = p.PositiveDuration()
		}
		return err
	})
	return o, err
}
