package testenv

import (
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"sync"
	"testing"

	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/outboxrelay/outbox/internal/servers"
)

// KafkaBrokersDefault is the number of brokers of a cluster started by
// StartKafka or Kafka.
const KafkaBrokersDefault = 3

// KafkaOptions configures StartKafka.
type KafkaOptions struct {
	// Brokers is the number of brokers (default KafkaBrokersDefault).
	Brokers int
	// Dir is the base directory under which the cluster's data directory is
	// created (default os.TempDir()). The cluster persists its topics,
	// records and producer state there, so that Restart keeps them.
	Dir string
	// Options are extra kfake options (SeedTopics, AllowAutoTopicCreation,
	// BrokerConfigs, ...). Ports and DataDir are managed by StartKafka.
	Options []kfake.Opt
}

// KafkaCluster is a kfake cluster (an in-process implementation of the
// Kafka protocol) listening on fixed loopback ports, which it keeps across
// restarts. Its methods are safe for concurrent use.
type KafkaCluster struct {
	dir   string
	ports []int
	opts  []kfake.Opt

	mu     sync.Mutex
	c      *kfake.Cluster // nil once stopped or while paused
	paused bool
}

// StartKafka starts a kfake cluster on 127.0.0.1, for use outside of tests
// (such as the `outbox bench` command); within tests use [Kafka]. Each
// broker listens on a port chosen by the kernel, which Restart keeps. The
// cluster persists its data in a new directory under opts.Dir.
//
// StartKafka returns the cluster and a stop function that closes it and
// removes its directory; stop is idempotent, and Main calls it if the
// caller has not.
func StartKafka(opts KafkaOptions) (k *KafkaCluster, stop func() error, err error) {
	brokers := opts.Brokers
	if brokers == 0 {
		brokers = KafkaBrokersDefault
	}
	if brokers < 1 {
		return nil, nil, fmt.Errorf("testenv: KafkaOptions.Brokers must be at least 1, got %d", brokers)
	}
	dir, err := NewServerDir(opts.Dir, "kafka", nil)
	if err != nil {
		return nil, nil, err
	}
	k = &KafkaCluster{dir: dir, opts: opts.Options}
	// Port 0 lets the kernel pick free ports with no race; they are then
	// fixed for the cluster's life.
	c, err := k.newCluster(make([]int, brokers))
	if err != nil {
		os.RemoveAll(dir)
		return nil, nil, err
	}
	k.c = c
	for _, addr := range c.ListenAddrs() {
		_, port, err := net.SplitHostPort(addr)
		if err == nil {
			var p int
			p, err = strconv.Atoi(port)
			k.ports = append(k.ports, p)
		}
		if err != nil {
			c.Close()
			os.RemoveAll(dir)
			return nil, nil, fmt.Errorf("testenv: kafka: listen address %q: %w", addr, err)
		}
	}
	return k, servers.AtExit("kafka", k.stop), nil
}

func (k *KafkaCluster) newCluster(ports []int) (*kfake.Cluster, error) {
	opts := append([]kfake.Opt{}, k.opts...)
	opts = append(opts, kfake.Ports(ports...), kfake.DataDir(k.dir))
	c, err := kfake.NewCluster(opts...)
	if err != nil {
		return nil, fmt.Errorf("testenv: kafka: start kfake cluster: %w", err)
	}
	return c, nil
}

// Seeds returns the brokers' addresses (127.0.0.1:PORT), the same across
// restarts.
func (k *KafkaCluster) Seeds() []string {
	seeds := make([]string, len(k.ports))
	for i, p := range k.ports {
		seeds[i] = net.JoinHostPort("127.0.0.1", strconv.Itoa(p))
	}
	return seeds
}

// Cluster returns the current kfake cluster (a new one after each Restart),
// or nil once stopped.
func (k *KafkaCluster) Cluster() *kfake.Cluster {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.c
}

// Restart closes the cluster (connections drop; the data is saved) and
// starts a new one on the same ports from the same data directory: topics,
// acknowledged records and idempotent-producer state survive. It returns the
// new cluster; the old one must no longer be used.
func (k *KafkaCluster) Restart() (*kfake.Cluster, error) {
	if err := k.Pause(); err != nil {
		return nil, err
	}
	return k.Resume()
}

// Pause closes the cluster: connections drop and nothing listens on its
// ports until Resume; the data is saved.
func (k *KafkaCluster) Pause() error {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.c == nil {
		return errors.New("testenv: kafka: cluster is stopped or paused")
	}
	k.c.Close()
	k.c = nil
	k.paused = true
	return nil
}

// Resume starts a paused cluster again on the same ports from the same
// data directory, and returns the new cluster.
func (k *KafkaCluster) Resume() (*kfake.Cluster, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if !k.paused {
		return nil, errors.New("testenv: kafka: cluster is not paused")
	}
	c, err := k.newCluster(k.ports)
	if err != nil {
		return nil, err
	}
	k.c, k.paused = c, false
	return c, nil
}

func (k *KafkaCluster) stop() error {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.c != nil {
		k.c.Close()
		k.c = nil
	}
	k.paused = false
	return os.RemoveAll(k.dir)
}

// kafkaByTest holds the cluster each test got from Kafka, for RestartKafka.
var kafkaByTest sync.Map // testing.TB → *KafkaCluster

// Kafka starts a kfake cluster of KafkaBrokersDefault brokers for this test,
// listening on 127.0.0.1 on fixed ports, and returns the seed addresses and
// the cluster. opts are extra kfake options (kfake.SeedTopics,
// kfake.AllowAutoTopicCreation, ...). The cluster is closed by t.Cleanup.
// A test gets at most one cluster this way.
func Kafka(t testing.TB, opts ...kfake.Opt) (seeds []string, c *kfake.Cluster) {
	t.Helper()
	if _, ok := kafkaByTest.Load(t); ok {
		t.Fatalf("testenv: Kafka called twice in test %s", t.Name())
	}
	k, stop, err := StartKafka(KafkaOptions{Dir: t.TempDir(), Options: opts})
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	kafkaByTest.Store(t, k)
	t.Cleanup(func() {
		kafkaByTest.Delete(t)
		if err := stop(); err != nil {
			t.Errorf("testenv: stop kafka: %v", err)
		}
	})
	return k.Seeds(), k.Cluster()
}

// PauseKafka stops the cluster this test got from [Kafka] (see
// [KafkaCluster.Pause]) and returns a function that starts it again on the
// same seed addresses with the same data and returns the new cluster. It
// calls t.Fatalf if the test has no cluster or either step fails.
func PauseKafka(t testing.TB) (resume func(t testing.TB) *kfake.Cluster) {
	t.Helper()
	k := kafkaOf(t)
	if err := k.Pause(); err != nil {
		t.Fatalf("testenv: pause kafka: %v", err)
	}
	return func(t testing.TB) *kfake.Cluster {
		t.Helper()
		c, err := k.Resume()
		if err != nil {
			t.Fatalf("testenv: resume kafka: %v", err)
		}
		return c
	}
}

func kafkaOf(t testing.TB) *KafkaCluster {
	t.Helper()
	v, ok := kafkaByTest.Load(t)
	if !ok {
		t.Fatalf("testenv: test %s has no Kafka cluster; call Kafka first", t.Name())
	}
	return v.(*KafkaCluster)
}

// RestartKafka restarts the cluster this test got from [Kafka] (see
// [KafkaCluster.Restart]) and returns the new cluster, on the same seed
// addresses and with the same data. It calls t.Fatalf if the test has no
// cluster or the restart fails.
func RestartKafka(t testing.TB) *kfake.Cluster {
	t.Helper()
	c, err := kafkaOf(t).Restart()
	if err != nil {
		t.Fatalf("testenv: restart kafka: %v", err)
	}
	return c
}
