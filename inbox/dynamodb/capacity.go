package dynamodb

import (
	"errors"
	"fmt"
	"math"
	"time"
)

// DynamoDB's limits that bound a window of keys on one item.
const (
	// MaxItemBytes is DynamoDB's item size limit, 400 KB (of 1,024 bytes),
	// counting attribute names and values.
	MaxItemBytes = 400 * 1024
	// WriteUnitBytes is the item size one write capacity unit covers: a write
	// of an item of S bytes costs ceil(S / 1 KB) units.
	WriteUnitBytes = 1024
	// PartitionWriteUnits is the most write units one partition, and so one
	// item, takes per second.
	PartitionWriteUnits = 1000

	// listOverhead and elementOverhead are DynamoDB's sizes of a list: 3
	// bytes plus 1 byte per element, plus the elements' own sizes.
	listOverhead    = 3
	elementOverhead = 1
)

// Capacity describes the load on one item updated through a [Window]. The
// window must remember every key for KeyLifetime (the longest time after
// which a duplicate may still arrive: the broker's redelivery horizon and the
// relay's longest retry) while WritesPerSecond updates arrive, so it needs
// N = KeyLifetime × WritesPerSecond keys, and the item grows by N × KeySize
// bytes. The article's rule is
//
//	KeyLifetime × KeySize × RPS ≤ 400 KB
//
// Plan applies it exactly, with DynamoDB's list overheads and the item's
// other attributes.
type Capacity struct {
	// KeyLifetime is how long a key must stay in the window. Required.
	KeyLifetime time.Duration
	// KeySize is the stored size of one key in bytes; default
	// [KeySizeDefault], between [KeySizeMin] and [KeySizeMax].
	KeySize int
	// WritesPerSecond is the peak rate of updates to one item. Required.
	WritesPerSecond float64
	// KeysAttribute names the list attribute; default
	// [KeysAttributeDefault]. Only its length matters here.
	KeysAttribute string
	// OtherBytes is the size of the item's other attributes (names and
	// values, the primary key included). Default 0.
	OtherBytes int
}

// Plan is what a [Capacity] needs.
type Plan struct {
	// Window is N, the keys the item keeps: ceil(KeyLifetime ×
	// WritesPerSecond), at least 1.
	Window int
	// KeyBytes is Window × KeySize, the article's KeyLifetime × KeySize × RPS.
	KeyBytes int
	// ItemBytes is the item's size with a full window: KeyBytes, the list's
	// overhead (3 bytes plus 1 per key), the attribute's name and OtherBytes.
	ItemBytes int
	// WriteUnits is what one update costs: ceil(ItemBytes / 1 KB).
	WriteUnits int
	// MaxWritesPerSecond is the most updates per second the item takes:
	// 1,000 write units per second per partition ÷ WriteUnits, the
	// article's "1,000 KB/s ÷ item size" in whole units.
	MaxWritesPerSecond int
	// Throttled reports WritesPerSecond > MaxWritesPerSecond: DynamoDB will
	// throttle the item at the expected rate. Keys then live longer than
	// KeyLifetime (fewer updates fill the window more slowly), so
	// idempotency holds, but throughput does not.
	Throttled bool
	// MaxWindow is the largest window that fits MaxItemBytes with this
	// KeySize, attribute name and OtherBytes.
	MaxWindow int
	// MaxKeyLifetime is the longest KeyLifetime that fits at
	// WritesPerSecond: MaxWindow ÷ WritesPerSecond.
	MaxKeyLifetime time.Duration
}

// ErrCapacity is matched (errors.Is) by the error of [Capacity.Plan] for a
// window that does not fit in one item.
var ErrCapacity = errors.New("inbox/dynamodb: window does not fit in one item")

// Plan computes the window and the item size, and reports an error wrapping
// [ErrCapacity] that names the knobs to turn when the item would exceed
// DynamoDB's 400 KB limit. Throttling is reported in the Plan, not as an
// error. Invalid fields give an error naming the field.
func (c Capacity) Plan() (Plan, error) {
	if c.KeySize == 0 {
		c.KeySize = KeySizeDefault
	}
	if c.KeysAttribute == "" {
		c.KeysAttribute = KeysAttributeDefault
	}
	switch {
	case c.KeyLifetime <= 0:
		return Plan{}, fmt.Errorf("inbox/dynamodb: Capacity.KeyLifetime must be positive (how long a duplicate may still arrive), got %v", c.KeyLifetime)
	case c.KeySize < KeySizeMin || c.KeySize > KeySizeMax:
		return Plan{}, fmt.Errorf("inbox/dynamodb: Capacity.KeySize must be between %d and %d bytes, got %d", KeySizeMin, KeySizeMax, c.KeySize)
	case !(c.WritesPerSecond > 0) || math.IsInf(c.WritesPerSecond, 0):
		return Plan{}, fmt.Errorf("inbox/dynamodb: Capacity.WritesPerSecond must be a positive number (peak updates per second to one item), got %v", c.WritesPerSecond)
	case c.OtherBytes < 0 || c.OtherBytes >= MaxItemBytes:
		return Plan{}, fmt.Errorf("inbox/dynamodb: Capacity.OtherBytes must be between 0 and %d, got %d", MaxItemBytes-1, c.OtherBytes)
	}
	fixed := c.OtherBytes + len(c.KeysAttribute) + listOverhead
	perKey := c.KeySize + elementOverhead

	var p Plan
	keys := c.KeyLifetime.Seconds() * c.WritesPerSecond
	if keys > MaxItemBytes { // far too many; avoid overflowing int below
		keys = MaxItemBytes
	}
	// Round up, tolerating float error (300 s × 100/s must be 30,000).
	p.Window = max(1, int(math.Ceil(keys-1e-9)))
	p.KeyBytes = p.Window * c.KeySize
	p.ItemBytes = fixed + p.Window*perKey
	p.WriteUnits = (p.ItemBytes + WriteUnitBytes - 1) / WriteUnitBytes
	p.MaxWritesPerSecond = PartitionWriteUnits / p.WriteUnits
	p.Throttled = c.WritesPerSecond > float64(p.MaxWritesPerSecond)
	p.MaxWindow = max(0, (MaxItemBytes-fixed)/perKey)
	p.MaxKeyLifetime = time.Duration(float64(p.MaxWindow) / c.WritesPerSecond * float64(time.Second)).Truncate(time.Millisecond)

	if p.ItemBytes > MaxItemBytes {
		return p, fmt.Errorf("%w: KeyLifetime %v × WritesPerSecond %v = %d keys of KeySize %d bytes make a %d-byte item (keys %d bytes, overhead and other attributes %d), over DynamoDB's %d-byte limit (KeyLifetime × KeySize × RPS ≤ 400 KB): shorten KeyLifetime to at most %v, or lower KeySize (at least %d), or spread the writes over more items to lower WritesPerSecond",
			ErrCapacity, c.KeyLifetime, c.WritesPerSecond, p.Window, c.KeySize, p.ItemBytes, p.KeyBytes, p.ItemBytes-p.KeyBytes, MaxItemBytes, p.MaxKeyLifetime, KeySizeMin)
	}
	return p, nil
}
