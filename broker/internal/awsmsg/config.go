package awsmsg

import (
	"context"
	"errors"
	"fmt"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/config"
)

// LoadConfig returns the AWS configuration a publisher named name (sqs,
// sns, kinesis) uses: a copy of given if set, else the SDK's default chain
// (with profile, if set); region, if set, overrides the region. It fails,
// with the fix in its message, when no region or no usable credentials are
// found; regionHint says where the publisher's URL puts the region.
func LoadConfig(ctx context.Context, name string, given *aws.Config, profile, region, regionHint string) (aws.Config, error) {
	var cfg aws.Config
	if given != nil {
		cfg = given.Copy()
	} else {
		var lo []func(*config.LoadOptions) error
		if profile != "" {
			lo = append(lo, config.WithSharedConfigProfile(profile))
		}
		var err error
		if cfg, err = config.LoadDefaultConfig(ctx, lo...); err != nil {
			return cfg, fmt.Errorf("%s: loading the AWS configuration: %w", name, err)
		}
	}
	if region != "" {
		cfg.Region = region
	}
	if cfg.Region == "" {
		return cfg, fmt.Errorf("%s: no AWS region: set AWS_REGION, a region in the profile, or Options.Region (%s)", name, regionHint)
	}
	if cfg.Credentials == nil {
		return cfg, errors.New(name + ": no AWS credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, AWS_PROFILE, a web identity token, or run with an instance or task role")
	}
	if _, err := cfg.Credentials.Retrieve(ctx); err != nil {
		return cfg, fmt.Errorf("%s: no usable AWS credentials (the environment, the shared files, web identity, the container or instance role were tried): %w", name, err)
	}
	return cfg, nil
}
