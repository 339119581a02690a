package cli

import (
	"github.com/spf13/pflag"

	"github.com/outboxrelay/outbox/cloudevents"
	"github.com/outboxrelay/outbox/internal/backends"
)

// ceFlags are the relay's CloudEvents flags: off unless --cloudevents
// names a content mode.
type ceFlags struct {
	mode        string
	source      string
	typePrefix  string
	contentType string
}

func (c *ceFlags) add(fs *pflag.FlagSet) {
	fs.StringVar(&c.mode, "cloudevents", "", "publish every message as a CloudEvent: binary (attributes in the broker's headers: Kafka ce_*, AMQP cloudEvents:*, NATS ce-*; the payload unchanged) or structured (the payload is the JSON event); empty: off")
	fs.StringVar(&c.source, "cloudevents-source", "", "the CloudEvents source of messages without a ce-source header, a URI-reference naming the producer, the same for every relay of the outbox (default "+cloudevents.SourceDefault+")")
	fs.StringVar(&c.typePrefix, "cloudevents-type-prefix", "", "put this before the topic to make the CloudEvents type of messages without a ce-type header (com.example. gives com.example.orders.created)")
	fs.StringVar(&c.contentType, "cloudevents-content-type", "", "the datacontenttype of messages without a Content-Type header (default "+cloudevents.DataContentTypeDefault+")")
}

// options returns the CloudEvents options, nil when off.
func (c *ceFlags) options(a *app) (*cloudevents.Options, error) {
	if c.mode == "" {
		for _, name := range []string{"cloudevents-source", "cloudevents-type-prefix", "cloudevents-content-type"} {
			if o := a.origins[name]; o.kind != "" && o.kind != "default" {
				return nil, usagef("%s is set but %s is not: give %s binary or structured", a.flagRef(name), backends.CloudEventsFlag, backends.CloudEventsFlag)
			}
		}
		return nil, nil
	}
	mode, err := cloudevents.ParseMode(c.mode)
	if err != nil {
		return nil, usagef("%s must be binary or structured, got %q", a.flagRef("cloudevents"), c.mode)
	}
	opts := &cloudevents.Options{Mode: mode, Source: c.source, TypePrefix: c.typePrefix, DataContentType: c.contentType}
	if err := opts.WithDefaults().Validate(); err != nil {
		return nil, usagef("%v (set with --cloudevents-source, --cloudevents-type-prefix, --cloudevents-content-type)", err)
	}
	return opts, nil
}
