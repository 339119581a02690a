// Command outbox runs the outbox relay and its tools: migrate, relay,
// status, dlq and demo. Run `outbox --help` for the list, and see package
// internal/cli for the commands themselves.
package main

import (
	"os"

	"github.com/outboxrelay/outbox/internal/cli"
)

func main() { os.Exit(cli.Main(os.Args[1:])) }
