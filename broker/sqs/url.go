package sqs

import (
	"fmt"
	"net/url"
	"strings"

	"github.com/outboxrelay/outbox/broker/internal/optcheck"
	"github.com/outboxrelay/outbox/internal/redact"
)

// URLParams are the query parameters ParseURL reads into Options.
var URLParams = []string{
	"endpoint",                // Endpoint (http://127.0.0.1:4100)
	"profile",                 // Profile
	"fifo",                    // FIFO (true/false): queue names end in .fifo
	"queue",                   // every topic to this one queue (a name or a URL)
	"batch_entries",           // BatchEntries (1 to 10; 1: SendMessage)
	"max_message_bytes",       // MaxMessageBytes
	"max_concurrent_requests", // MaxConcurrentRequests
	"publish_timeout",         // PublishTimeout (a duration: 10s)
	"protocol",                // json (default) or query (for servers such as goaws)
}

// URLOptions are what ParseURL read: Options, plus the queue all topics go
// to (Queue, "" for one queue per topic) and the query protocol.
type URLOptions struct {
	Options
	Queue string
	Query bool
}

// ParseURL reads an SQS URL, sqs://[REGION][?param=value...], such as
// sqs://eu-west-1?fifo=true or sqs://?endpoint=http://127.0.0.1:4100:
// the host, if any, is the region (else the AWS configuration's), and the
// parameters listed in URLParams set the matching fields. Credentials are
// never in the URL: they come from the AWS configuration chain (the
// environment, AWS_PROFILE and the shared files, web identity, the
// container or instance role). Errors name the parameter.
func ParseURL(raw string) (URLOptions, error) {
	var o URLOptions
	shown := redact.URL(raw)
	u, err := url.Parse(raw)
	if err != nil || u.Scheme != "sqs" || u.Opaque != "" {
		return o, fmt.Errorf("sqs: URL %q: want sqs://[region][?endpoint=…&fifo=true…]", shown)
	}
	if u.User != nil {
		return o, fmt.Errorf("sqs: URL %q holds credentials; AWS credentials come from the AWS configuration (AWS_PROFILE, AWS_SHARED_CREDENTIALS_FILE, the environment, a role), never the URL", shown)
	}
	if strings.Trim(u.Path, "/") != "" || u.Fragment != "" {
		return o, fmt.Errorf("sqs: URL %q has a path; give the queue with ?queue= or let each topic name its queue", shown)
	}
	o.Region = u.Host
	subject := fmt.Sprintf("sqs: URL %q", shown)
	err = optcheck.Query(u.Query(), subject, URLParams, nil, func(p optcheck.Param) error {
		var err error
		switch p.Name {
		case "endpoint":
			o.Endpoint = p.Value
		case "profile":
			o.Profile = p.Value
		case "fifo":
			o.FIFO, err = p.Bool()
		case "queue":
			o.Queue = p.Value
		case "batch_entries":
			o.BatchEntries, err = p.PositiveInt()
		case "max_message_bytes":
			o.MaxMessageBytes, err = p.PositiveInt()
		case "max_concurrent_requests":
			o.MaxConcurrentRequests, err = p.PositiveInt()
		case "publish_timeout":
			o.PublishTimeout, err = p.PositiveDuration()
		case "protocol":
			switch p.Value {
			case "json":
			case "query":
				o.Query = true
			default:
				err = p.Bad("json or query")
			}
		}
		return err
	})
	if err == nil && o.Queue != "" && o.FIFO && !isURL(o.Queue) && !strings.HasSuffix(o.Queue, ".fifo") {
		err = fmt.Errorf("%s: queue=%s with fifo=true: a FIFO queue's name ends in .fifo", subject, o.Queue)
	}
	return o, err
}
