package cloudevents

import (
	"maps"
	"slices"
)

// MapHeaders reads headers held in a map, as the consumers of Redis Streams
// (the entry's "header.<name>" fields), SQS and SNS (the message
// attributes, or the unpacked Outbox-Headers attribute) and Kinesis (the
// envelope's headers, see broker/kinesis.Decode) have them:
//
//	ev, err := cloudevents.Decode(cloudevents.Kinesis, cloudevents.MapHeaders(m.Headers), "", m.Payload)
type MapHeaders map[string]string

// Get returns the value of key, "" when absent.
func (h MapHeaders) Get(key string) string { return h[key] }

// Keys returns the header names, sorted.
func (h MapHeaders) Keys() []string { return slices.Sorted(maps.Keys(h)) }
