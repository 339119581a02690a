package bench

import (
	"os"
	"strconv"
)

func inFlightProbe() int { n, _ := strconv.Atoi(os.Getenv("PROBE_INFLIGHT")); return n }
