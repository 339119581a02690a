package sqs

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/aws/aws-sdk-go-v2/aws"
	awssqs "github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/smithy-go"

	"github.com/outboxrelay/outbox"
)

var _ outbox.HealthChecker = (*Publisher)(nil)

// Health implements [outbox.HealthChecker]: it sends ListQueues (one
// result; bounded by ctx, or PublishTimeout without a deadline) and returns
// nil when SQS answered with the credentials accepted. An access-denied
// answer counts as healthy: SQS is reachable and signs the credentials in,
// and a relay needs only sqs:SendMessage and sqs:GetQueueUrl (a queue it
// may not write is blocked and reported per destination).
func (p *Publisher) Health(ctx context.Context) error {
	return p.gate.Run(func() error {
		if _, ok := ctx.Deadline(); !ok {
			var cancel context.CancelFunc
			ctx, cancel = context.WithTimeout(ctx, p.opts.PublishTimeout)
			defer cancel()
		}
		_, err := p.client.ListQueues(ctx, &awssqs.ListQueuesInput{MaxResults: aws.Int32(1)})
		var ae smithy.APIError
		if errors.As(err, &ae) && (strings.HasPrefix(ae.ErrorCode(), "AccessDenied") || ae.ErrorCode() == "AuthorizationError") {
			return nil
		}
		if err != nil {
			return fmt.Errorf("sqs: %w", err)
		}
		return nil
	})
}
