package awsmsg

import (
	"context"
	"strings"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
)

func TestLoadConfigNamesTheFix(t *testing.T) {
	ctx := context.Background()
	creds := credentials.NewStaticCredentialsProvider("id", "secret", "")
	if _, err := LoadConfig(ctx, "sqs", &aws.Config{Credentials: creds}, "", "", "?region= in the URL"); err == nil ||
		!strings.Contains(err.Error(), "sqs: no AWS region") || !strings.Contains(err.Error(), "?region= in the URL") {
		t.Fatalf("no region: %v", err)
	}
	if _, err := LoadConfig(ctx, "sns", &aws.Config{Region: "eu-west-1"}, "", "", ""); err == nil || !strings.Contains(err.Error(), "sns: no AWS credentials") {
		t.Fatalf("no credentials: %v", err)
	}
	cfg, err := LoadConfig(ctx, "kinesis", &aws.Config{Region: "us-east-1", Credentials: creds}, "", "eu-west-1", "")
	if err != nil || cfg.Region != "eu-west-1" {
		t.Fatalf("region override: %v, %q", err, cfg.Region)
	}
}
