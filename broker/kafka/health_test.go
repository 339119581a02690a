package kafka_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/outboxrelay/outbox"
	"github.com/outboxrelay/outbox/broker/kafka"
	"github.com/outboxrelay/outbox/internal/testenv"
)

// TestHealth: Health is nil while a broker answers, an error while none
// does, nil again once the cluster is back, and ErrClosed after Close.
func TestHealth(t *testing.T) {
	seeds, c := testenv.Kafka(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	p, err := kafka.Dial(ctx, kafka.Options{Brokers: seeds})
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Health(ctx); err != nil {
		t.Fatalf("Health with the cluster up: %v", err)
	}
	c.Close()
	short, cancelShort := context.WithTimeout(ctx, 2*time.Second)
	err = p.Health(short)
	cancelShort()
	if err == nil {
		t.Fatal("Health with every broker down: nil, want an error")
	}
	t.Logf("down: %v", err)
	testenv.RestartKafka(t)
	if err := p.Health(ctx); err != nil {
		t.Fatalf("Health after the cluster came back: %v", err)
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if err := p.Health(ctx); !errors.Is(err, outbox.ErrClosed) {
		t.Fatalf("Health after Close: %v, want ErrClosed", err)
	}
}
