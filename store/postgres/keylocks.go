package postgres

import (
	"crypto/sha256"
	"encoding/binary"
	"slices"
	"strconv"
)

// Key locks (Options.KeyLocks). A write takes, before its messages draw
// their sequence numbers, transaction-scoped advisory locks that conflict
// with those of every other write of one of its keys, and holds them until
// its transaction ends. So of two transactions writing a key, the second
// to write waits for the first to commit (or roll back) before drawing its
// numbers: a key's messages get their numbers, and the relay publishes
// them, in the order their transactions committed.
//
// PostgreSQL's lock table is shared and bounded (max_locks_per_transaction
// × (max_connections + max_prepared_transactions) entries, 6,400 by
// default), so a write does not take a lock per key whatever its size:
//
//   - A write of at most keyLockMaxKeys distinct keys takes a shared lock
//     on the group of each key (one of keyLockGroups, by the key's hash),
//     then an exclusive lock on each key: at most 2 × keyLockMaxKeys locks.
//   - A larger write takes an exclusive lock on the group of each key
//     instead: at most keyLockGroups locks. Until it commits it holds back
//     the writers of every key of those groups, not only of its own keys.
//
// Two writes of one key conflict either way: on the key's lock (small and
// small), or on its group's lock (small and large, large and large). Each
// write takes its group locks in ascending order, then its key locks in
// ascending order, so that writes of one statement each cannot deadlock
// one another. Lock IDs are 64-bit and specific to the schema and table
// prefix; keyless messages take no lock (they have no order).
const (
	keyLockMaxKeys = 256
	keyLockGroups  = 256
)

// keyLocker computes the advisory lock IDs of one outbox's writes.
type keyLocker struct {
	salt   uint64               // mixes the schema and prefix into key lock IDs
	groups [keyLockGroups]int64 // lock ID of each group
}

func newKeyLocker(o Options) *keyLocker {
	base := "outbox.keylock\x00" + o.Schema + "\x00" + o.TablePrefix + "\x00"
	sum := sha256.Sum256([]byte(base))
	kl := &keyLocker{salt: binary.LittleEndian.Uint64(sum[:8])}
	for g := range kl.groups {
		sum := sha256.Sum256([]byte(base + "group " + strconv.Itoa(g)))
		kl.groups[g] = int64(binary.LittleEndian.Uint64(sum[:8]))
	}
	return kl
}

// keyLock returns the lock ID of a key from its SHA-256 digest (the one
// behind its partition hash: bytes 4 to 11, the partition uses 0 to 3).
func (kl *keyLocker) keyLock(sum *[sha256.Size]byte) int64 {
	return int64(binary.LittleEndian.Uint64(sum[4:12]) ^ kl.salt)
}

// locks returns the lock IDs a write of keys (with their 32-bit hashes and
// key lock IDs; keyless messages excluded) takes shared and exclusive,
// each in ascending order.
func (kl *keyLocker) locks(hashes []uint32, keyLocks []int64) (shared, exclusive []int64) {
	keys := slices.Compact(slices.Sorted(slices.Values(keyLocks)))
	groups := make([]int64, 0, min(len(hashes), keyLockGroups))
	for _, h := range hashes {
		groups = append(groups, kl.groups[h%keyLockGroups])
	}
	slices.Sort(groups)
	groups = slices.Compact(groups)
	if len(keys) > keyLockMaxKeys {
		return []int64{}, groups
	}
	return groups, keys
}
