package sns

import (
	"fmt"
	"net/url"
	"strings"

	"github.com/outboxrelay/outbox/broker/internal/optcheck"
	"github.com/outboxrelay/outbox/internal/redact"
)

// URLParams are the query parameters ParseURL reads into Options.
var URLParams = []string{
	"endpoint", "profile", "account", "partition", "fifo",
	"topic",                   // every outbox topic to this one SNS topic (a name or an ARN)
	"batch_entries",           // BatchEntries (1: Publish)
	"max_message_bytes",       // MaxMessageBytes
	"max_concurrent_requests", // MaxConcurrentRequests
	"publish_timeout",         // PublishTimeout
}

// URLOptions are what ParseURL read: Options plus the one topic every
// message goes to ("" for one SNS topic per outbox topic).
type URLOptions struct {
	Options
	Topic string
}

// ParseURL reads sns://[REGION]?account=123456789012[&fifo=true…]: the
// host, if any, is the region; credentials come only from the AWS
// configuration chain. Errors name the parameter.
func ParseURL(raw string) (URLOptions, error) {
	var o URLOptions
	shown := redact.URL(raw)
	u, err := url.Parse(raw)
	if err != nil || u.Scheme != "sns" || u.Opaque != "" {
		return o, fmt.Errorf("sns: URL %q: want sns://[region]?account=ACCOUNT[&fifo=true…]", shown)
	}
	if u.User != nil {
		return o, fmt.Errorf("sns: URL %q holds credentials; AWS credentials come from the AWS configuration (AWS_PROFILE, AWS_SHARED_CREDENTIALS_FILE, the environment, a role), never the URL", shown)
	}
	if strings.Trim(u.Path, "/") != "" || u.Fragment != "" {
		return o, fmt.Errorf("sns: URL %q has a path; give the topic with ?topic= or let each outbox topic name its SNS topic", shown)
	}
	o.Region = u.Host
	err = optcheck.Query(u.Query(), fmt.Sprintf("sns: URL %q", shown), URLParams, nil, func(p optcheck.Param) error {
		var err error
		switch p.Name {
		case "endpoint":
			o.Endpoint = p.Value
		case "profile":
			o.Profile = p.Value
		case "account":
			o.Account = p.Value
		case "partition":
			o.Partition = p.Value
		case "fifo":
			o.FIFO, err = p.Bool()
		case "topic":
			o.Topic = p.Value
		case "batch_entries":
			o.BatchEntries, err = p.PositiveInt()
		case "max_message_bytes":
			o.MaxMessageBytes, err = p.PositiveInt()
		case "max_concurrent_requests":
			o.MaxConcurrentRequests, err = p.PositiveInt()
		case "publish_timeout":
			o.PublishTimeout, err = p.PositiveDuration()
		}
		return err
	})
	if err == nil && o.Account == "" && !strings.HasPrefix(o.Topic, "arn:") {
		err = fmt.Errorf("sns: URL %q: give account=ACCOUNT (the 12-digit AWS account of the topics) or topic=ARN", shown)
	}
	return o, err
}
