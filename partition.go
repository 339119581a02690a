package outbox

import (
	"crypto/sha256"
	"encoding/binary"
	"math/rand/v2"
)

// DefaultPartitions is the partition count P chosen at migration unless
// configured otherwise.
const DefaultPartitions = 64

// MaxPartitions bounds P.
const MaxPartitions = 4096

// PartitionOf maps a key to one of n partitions: the first 4 bytes of
// SHA-256(key) read as a little-endian uint32, modulo n (the formula of
// Brighter's DynamoDB ADR 0034). An empty key gets a random partition.
// It panics if n < 1.
func PartitionOf(key string, n int) int {
	if n < 1 {
		panic("outbox: PartitionOf needs n >= 1")
	}
	if key == "" {
		return rand.IntN(n)
	}
	sum := sha256.Sum256([]byte(key))
	return int(binary.LittleEndian.Uint32(sum[:4]) % uint32(n))
}
