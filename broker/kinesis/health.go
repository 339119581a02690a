package kinesis

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/aws/aws-sdk-go-v2/aws"
	awskinesis "github.com/aws/aws-sdk-go-v2/service/kinesis"
	"github.com/aws/smithy-go"

	"github.com/outboxrelay/outbox"
)

var _ outbox.HealthChecker = (*Publisher)(nil)

// Health implements [outbox.HealthChecker]: it sends ListStreams (one
// result; bounded by ctx, or PublishTimeout without a deadline) and returns
// nil when Kinesis answered with the credentials accepted. An
// access-denied answer counts as healthy: Kinesis is reachable and signs
// the credentials in, and a relay needs only kinesis:PutRecords (a stream
// it may not write is blocked and reported per destination).
func (p *Publisher) Health(ctx context.Context) error {
	return p.gate.Run(func() error {
		if _, ok := ctx.Deadline(); !ok {
			var cancel context.CancelFunc
			ctx, cancel = context.WithTimeout(ctx, p.opts.PublishTimeout)
			defer cancel()
		}
		_, err := p.client.ListStreams(ctx, &awskinesis.ListStreamsInput{Limit: aws.Int32(1)})
		var ae smithy.APIError
		if errors.As(err, &ae) && strings.HasPrefix(ae.ErrorCode(), "AccessDenied") {
			return nil
		}
		if err != nil {
			return fmt.Errorf("kinesis: %w", err)
		}
		return nil
	})
}
