package backends

import (
	"net/url"
	"slices"
	"strings"
)

// CloudEventsFlag is the flag that turns BrokerOptions.CloudEvents on.
const CloudEventsFlag = "--cloudevents"

// cloudEventsSchemes are the broker schemes whose publishers take
// CloudEvents options (each applies its protocol binding). A broker added
// later joins the list once its publisher does.
var cloudEventsSchemes = []string{"amqp", "amqps", "kafka", "nats", "tls", "kinesis", "redis", "rediss", "sqs", "sns"}

// checkCloudEvents refuses CloudEvents options for a broker that cannot
// send them, and invalid ones.
func (o BrokerOptions) checkCloudEvents(u *url.URL) error {
	if o.CloudEvents == nil {
		return nil
	}
	if !slices.Contains(cloudEventsSchemes, u.Scheme) {
		return Invalid(CloudEventsFlag, "the %s:// broker does not publish CloudEvents yet (brokers that do: %s); leave the flag out", u.Scheme, strings.Join(cloudEventsSchemes, ", "))
	}
	opts := o.CloudEvents.WithDefaults()
	if err := opts.Validate(); err != nil {
		return Invalid(CloudEventsFlag, "%v", err)
	}
	return nil
}
