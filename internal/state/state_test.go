package state

import (
	"encoding/json"
	"testing"
)

var k = Key{Namespace: "n", Key: "k"}

// Every row of a batch reads the version the batch first read, even when
// the cache moves on meanwhile (another lane committing).
func TestBatchReadsOneVersion(t *testing.T) {
	c := NewCache(10)
	c.Put(map[Key]Entry{k: {Value: json.RawMessage("1"), Version: 5}})
	b := NewBatch(c)
	r1 := b.Row()
	if v, ok, _ := r1.Get("n", "k"); !ok || string(v) != "1" {
		t.Fatalf("first read %s %v", v, ok)
	}
	r1.Commit()
	c.Put(map[Key]Entry{k: {Value: json.RawMessage("2"), Version: 9}})
	r2 := b.Row()
	r2.Get("n", "k")
	if ch := r2.Commit(); len(ch.Reads) != 1 || ch.Reads[0].Version != 5 {
		t.Errorf("second row read %+v, want version 5 like the first", ch.Reads)
	}
	// A key the cache does not know reads as absent, version 0.
	r3 := b.Row()
	if _, ok, _ := r3.Get("n", "other"); ok {
		t.Error("unknown key read as present")
	}
	if ch := r3.Discard(); len(ch.Reads) != 1 || ch.Reads[0].Version != 0 || len(ch.Writes) != 0 {
		t.Errorf("discarded row change %+v", ch)
	}
}

func TestCacheKeepsTheNewestAndStaysBounded(t *testing.T) {
	c := NewCache(8)
	c.Put(map[Key]Entry{k: {Value: json.RawMessage("2"), Version: 9}})
	c.Put(map[Key]Entry{k: {Value: json.RawMessage("1"), Version: 5}}) // an older read
	if e, _ := c.Get(k); e.Version != 9 {
		t.Errorf("an older entry replaced a newer one: %+v", e)
	}
	c.Put(map[Key]Entry{k: {}}) // deleted since
	if e, ok := c.Get(k); !ok || e.Version != 0 {
		t.Errorf("a delete was not recorded: %+v %v", e, ok)
	}
	for i := range 100 {
		c.Put(map[Key]Entry{{Namespace: "n", Key: string(rune('a' + i))}: {Version: int64(i + 1)}})
	}
	if c.Len() > 8 {
		t.Errorf("cache holds %d keys, bound 8", c.Len())
	}
}
