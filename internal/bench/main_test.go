package bench

// testChildEnv marks a process the tests started as the bench's relay or
// broker process: the test binary then runs the outbox command line
// (TestMain in main_external_test.go) instead of the tests.
const testChildEnv = "OUTBOX_BENCH_TEST_CHILD"

// TestChildEnv is testChildEnv for the external test package.
const TestChildEnv = testChildEnv

// children returns o with the test binary as the outbox binary of the
// relay and broker processes.
func children(o Options) Options {
	o.ChildEnv = append(o.ChildEnv, testChildEnv+"=1")
	return o
}
