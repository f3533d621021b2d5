// Package state holds transform state as handlers see it: values kept by
// namespace and key between messages (a visit counter per patient, the last
// order seen), read through a node's cache and written in the transform
// hand-off.
//
// # Model
//
// Every committed value has a version, drawn from one database sequence, so
// a version is never reused even when a key is deleted and written again.
// Version 0 means "absent".
//
// A drainer transforms a batch of rows against a Batch. Reads come from the
// rows before it in the batch (their writes), then from the Batch's own
// memo of what it read, then from the node's Cache. A key the cache does not
// know is read as absent: the guess is recorded like any other read and
// checked in the hand-off, so a wrong guess costs a re-run, never a wrong
// result. Each row's reads (key and version seen) and writes go with its
// hand-off, which, inside the transaction that consumes the rows, locks the
// keys, checks that every version read is still the committed one and
// applies the writes. If any is not, the hand-off is rolled back, the cache
// is refreshed with the committed values and the batch runs again. So:
//
//   - a message's writes commit exactly when its row is consumed: a drainer
//     that crashes before the commit leaves nothing behind, one that crashes
//     after it left the row done, and it is not run again;
//   - two lanes or nodes that read, modify and write the same key never lose
//     an update: the second to commit finds the version it read gone;
//   - a node's stale cache is never acted on: it fails the check and is
//     refreshed.
//
// Scripts have no side effects outside the message and the state, so a
// re-run is invisible except for the log lines a script writes twice.
package state

import (
	"encoding/json"
	"errors"
	"fmt"
	"unicode/utf8"
)

// Key names one value.
type Key struct {
	Namespace string
	Key       string
}

func (k Key) String() string { return fmt.Sprintf("%q/%q", k.Namespace, k.Key) }

// Entry is a committed value. Version 0 means the key is absent; Value is
// then nil.
type Entry struct {
	Value   json.RawMessage
	Version int64
}

// Read is a value a row's transform read from committed state.
type Read struct {
	Key     Key
	Version int64 // 0: read as absent
}

// Write is a value a row's transform left. Value nil deletes the key.
type Write struct {
	Key   Key
	Value json.RawMessage
	// Version is set by a successful hand-off: the version the value
	// committed as, 0 for a delete, or Superseded when a later row of the
	// batch wrote the key again (only the last write is stored).
	Version int64
}

// Superseded is the Version of a write a later row of its batch replaced.
const Superseded = -1

// Change is what one row's transform did to state: the committed versions
// it read and the writes it made, in the order made (a key written twice
// appears once, with its last value).
type Change struct {
	Reads  []Read
	Writes []Write
}

// Empty reports whether the change read and wrote nothing.
func (c *Change) Empty() bool { return c == nil || len(c.Reads) == 0 && len(c.Writes) == 0 }

// Limits on keys and values. State is for small facts kept between
// messages, not for storing messages: a runaway script should fail its
// message, not fill the database.
const (
	MaxNameLen   = 200       // namespace and key, in bytes
	MaxValueSize = 256 << 10 // one JSON value, in bytes
)

// CheckKey validates a namespace and key. Errors do not quote the key: keys
// are often patient identifiers.
func CheckKey(namespace, key string) error {
	switch {
	case namespace == "":
		return errors.New("state namespace is empty")
	case key == "":
		return errors.New("state key is empty")
	case len(namespace) > MaxNameLen:
		return fmt.Errorf("state namespace is %d bytes; at most %d", len(namespace), MaxNameLen)
	case len(key) > MaxNameLen:
		return fmt.Errorf("state key is %d bytes; at most %d", len(key), MaxNameLen)
	case !utf8.ValidString(namespace) || !utf8.ValidString(key):
		return errors.New("state namespace and key must be valid UTF-8")
	}
	return nil
}

// Source answers reads of committed state. ok is false for a key the
// source does not know, which a Batch reads as absent.
type Source interface {
	Get(k Key) (e Entry, ok bool)
}

// Batch is committed state as one run over a batch of rows sees it, with
// the writes of the rows already run. It is used by one goroutine.
type Batch struct {
	src Source
	// seen memoizes what the batch read from src, so every row of the
	// batch reads the same version of a key even when the cache moves on
	// meanwhile (another lane committing): mixed versions would always
	// fail the hand-off's check.
	seen map[Key]Entry
	// pending holds the writes of the rows committed to the batch so far;
	// a nil Value is a delete.
	pending map[Key]json.RawMessage
}

// NewBatch starts a batch reading committed state from src.
func NewBatch(src Source) *Batch {
	return &Batch{src: src, seen: map[Key]Entry{}, pending: map[Key]json.RawMessage{}}
}

// Row starts the state view of the next row of the batch.
func (b *Batch) Row() *Row {
	return &Row{b: b}
}

func (b *Batch) committed(k Key) Entry {
	if e, ok := b.seen[k]; ok {
		return e
	}
	e, ok := b.src.Get(k)
	if !ok {
		e = Entry{}
	}
	b.seen[k] = e
	return e
}

// Row is one row's view of state while its transform runs: its own writes
// over the batch's. Nothing it does is visible to later rows until Commit.
type Row struct {
	b      *Batch
	reads  []Read
	read   map[Key]bool
	writes map[Key]json.RawMessage
	order  []Key
}

// Get returns the value of a key as this row sees it; ok is false when the
// key is absent.
func (r *Row) Get(namespace, key string) (json.RawMessage, bool, error) {
	if err := CheckKey(namespace, key); err != nil {
		return nil, false, err
	}
	k := Key{namespace, key}
	if v, ok := r.writes[k]; ok {
		return v, v != nil, nil
	}
	if v, ok := r.b.pending[k]; ok {
		// Written by an earlier row of the batch: that row's own read (if
		// any) is what the hand-off checks.
		return v, v != nil, nil
	}
	e := r.b.committed(k)
	if !r.read[k] {
		if r.read == nil {
			r.read = map[Key]bool{}
		}
		r.read[k] = true
		r.reads = append(r.reads, Read{Key: k, Version: e.Version})
	}
	return e.Value, e.Version != 0, nil
}

// Set writes a key. value must be one JSON value.
func (r *Row) Set(namespace, key string, value json.RawMessage) error {
	if err := CheckKey(namespace, key); err != nil {
		return err
	}
	if value == nil {
		return errors.New("state value is missing")
	}
	if len(value) > MaxValueSize {
		return fmt.Errorf("state value is %d bytes; at most %d", len(value), MaxValueSize)
	}
	if !json.Valid(value) {
		return errors.New("state value is not valid JSON")
	}
	r.put(Key{namespace, key}, value)
	return nil
}

// Delete removes a key.
func (r *Row) Delete(namespace, key string) error {
	if err := CheckKey(namespace, key); err != nil {
		return err
	}
	r.put(Key{namespace, key}, nil)
	return nil
}

func (r *Row) put(k Key, v json.RawMessage) {
	if r.writes == nil {
		r.writes = map[Key]json.RawMessage{}
	}
	if _, ok := r.writes[k]; !ok {
		r.order = append(r.order, k)
	}
	r.writes[k] = v
}

// Commit makes the row's writes visible to the later rows of the batch and
// returns its change for the hand-off.
func (r *Row) Commit() *Change {
	c := &Change{Reads: r.reads}
	for _, k := range r.order {
		v := r.writes[k]
		c.Writes = append(c.Writes, Write{Key: k, Value: v})
		r.b.pending[k] = v
	}
	return c
}

// Discard drops the row's writes (its message failed) and returns its
// reads: the failure may have depended on what it read, so the hand-off
// still checks them.
func (r *Row) Discard() *Change {
	return &Change{Reads: r.reads}
}

// Writes returns the writes the row has made so far, in order, without
// committing them; a dry run shows them.
func (r *Row) Writes() []Write {
	out := make([]Write, 0, len(r.order))
	for _, k := range r.order {
		out = append(out, Write{Key: k, Value: r.writes[k]})
	}
	return out
}
