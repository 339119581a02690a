// Command kfakeserve runs an in-memory Kafka (franz-go's kfake) as a
// process of its own, for measuring the relay against Kafka with
// `outbox bench --broker kafka://…` where no Kafka is installed:
//
//	go run ./internal/kfakeserve -port 19092 &
//	outbox bench --broker kafka://127.0.0.1:19092,127.0.0.1:19093,127.0.0.1:19094 --scenarios relay/key
//
// It is a test fixture, not a Kafka: in memory, in one process.
package main

import (
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/twmb/franz-go/pkg/kfake"
)

func main() {
	port := flag.Int("port", 19092, "first broker's port; the others follow")
	brokers := flag.Int("brokers", 3, "number of brokers")
	flag.Parse()
	if *port < 1 || *port+*brokers > 65536 || *brokers < 1 {
		fmt.Fprintln(os.Stderr, "kfakeserve: -port and -brokers must give ports between 1 and 65535")
		os.Exit(2)
	}
	ports := make([]int, *brokers)
	for i := range ports {
		ports[i] = *port + i
	}
	c, err := kfake.NewCluster(kfake.NumBrokers(*brokers), kfake.Ports(ports...))
	if err != nil {
		fmt.Fprintln(os.Stderr, "kfakeserve:", err)
		os.Exit(1)
	}
	fmt.Println(strings.Join(c.ListenAddrs(), ","))
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, os.Interrupt, syscall.SIGTERM)
	<-sig
	c.Close()
}
