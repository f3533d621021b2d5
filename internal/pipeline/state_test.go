package pipeline_test

import (
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/mefor/mefor/internal/pipeline"
	"github.com/mefor/mefor/internal/state"
)

// routedRow stores a message with one pending routed row and returns the
// row as a drainer reads it.
func (f *fixture) routedRow() pipeline.Row {
	f.T.Helper()
	var id int64
	if err := f.DB.Pool.QueryRow(f.Ctx, `
		INSERT INTO mefor_message (channel, source, size, raw, status) VALUES ('adt', 'test', 9, 'MSH|body', 'routed')
		RETURNING id`).Scan(&id); err != nil {
		f.T.Fatal(err)
	}
	f.Exec(`INSERT INTO mefor_work (message_id, stage, lane, channel, route, handler) VALUES ($1, 'routed', 'routed:adt', 'adt', 'out', 'js')`, id)
	rows, err := pipeline.PendingRows(f.Ctx, f.DB.Pool, "routed:adt", 100)
	if err != nil {
		f.T.Fatal(err)
	}
	return rows[len(rows)-1]
}

func (f *fixture) handoff(rows []pipeline.Row, decisions []pipeline.TransformDecision) error {
	return pgx.BeginFunc(f.Ctx, f.DB.Pool, func(tx pgx.Tx) error {
		return pipeline.TransformBatch(f.Ctx, tx, nil, pipeline.NoFence, rows, decisions)
	})
}

var counter = state.Key{Namespace: "test", Key: "counter"}

func change(readVersion int64, value string) *state.Change {
	c := &state.Change{Reads: []state.Read{{Key: counter, Version: readVersion}}}
	if value != "" {
		c.Writes = []state.Write{{Key: counter, Value: json.RawMessage(value)}}
	}
	return c
}

func (f *fixture) counter() (string, int64) {
	f.T.Helper()
	row, ok, err := pipeline.ReadState(f.Ctx, f.DB.Pool, nil, counter.Namespace, counter.Key)
	if err != nil {
		f.T.Fatal(err)
	}
	if !ok {
		return "", 0
	}
	return string(row.Value), row.Version
}

func TestTransformHandoffWritesStateOnce(t *testing.T) {
	f := newFixture(t)
	r1, r2 := f.routedRow(), f.routedRow()
	// Two rows of one batch: the second read the first's write, so only
	// the first read is checked, and only the last write is stored.
	d := []pipeline.TransformDecision{{State: change(0, "1")}, {State: &state.Change{Writes: []state.Write{{Key: counter, Value: json.RawMessage("2")}}}}}
	if err := f.handoff([]pipeline.Row{r1, r2}, d); err != nil {
		t.Fatal(err)
	}
	v, version := f.counter()
	if v != "2" || version == 0 {
		t.Fatalf("counter %q version %d, want 2", v, version)
	}
	if d[0].State.Writes[0].Version != state.Superseded || d[1].State.Writes[0].Version != version {
		t.Errorf("reported versions %d, %d; want superseded, %d", d[0].State.Writes[0].Version, d[1].State.Writes[0].Version, version)
	}
	if n := f.Int(`SELECT count(*) FROM mefor_work WHERE status = 'done'`); n != 2 {
		t.Errorf("%d rows consumed, want 2", n)
	}
}

// A hand-off whose transform read a version that is no longer the
// committed one writes nothing at all, and says what is committed now.
func TestTransformHandoffRefusesAStaleRead(t *testing.T) {
	f := newFixture(t)
	if err := f.handoff([]pipeline.Row{f.routedRow()}, []pipeline.TransformDecision{{State: change(0, "1")}}); err != nil {
		t.Fatal(err)
	}
	_, v1 := f.counter()

	// Another lane read absent too, and incremented to 1: refused.
	r := f.routedRow()
	err := f.handoff([]pipeline.Row{r}, []pipeline.TransformDecision{{State: change(0, "1")}})
	var c *pipeline.StateConflict
	if !errors.As(err, &c) {
		t.Fatalf("stale read handed off: %v", err)
	}
	if e := c.Current[counter]; string(e.Value) != "1" || e.Version != v1 {
		t.Errorf("conflict reports %+v, want the committed value 1 at version %d", e, v1)
	}
	if st := f.Int(`SELECT count(*) FROM mefor_work WHERE id = $1 AND status = 'pending'`, r.ID); st != 1 {
		t.Error("the refused hand-off consumed its row")
	}
	// A stale read fails even when the row only read (its failure may
	// have depended on it), and even when the row is dead-lettered.
	err = f.handoff([]pipeline.Row{r}, []pipeline.TransformDecision{{DeadReason: "boom", State: change(0, "")}})
	if !errors.As(err, &c) {
		t.Fatalf("stale read of a dead-lettered row handed off: %v", err)
	}
	// With the committed version it goes through.
	if err := f.handoff([]pipeline.Row{r}, []pipeline.TransformDecision{{State: change(v1, "2")}}); err != nil {
		t.Fatal(err)
	}
	if v, _ := f.counter(); v != "2" {
		t.Errorf("counter %s, want 2", v)
	}
	// A delete, and a key written again afterwards never gets back a
	// version it had.
	_, v2 := f.counter()
	del := &state.Change{Reads: []state.Read{{Key: counter, Version: v2}}, Writes: []state.Write{{Key: counter}}}
	if err := f.handoff([]pipeline.Row{f.routedRow()}, []pipeline.TransformDecision{{State: del}}); err != nil {
		t.Fatal(err)
	}
	if v, _ := f.counter(); v != "" {
		t.Fatalf("deleted counter reads %q", v)
	}
	if err := f.handoff([]pipeline.Row{f.routedRow()}, []pipeline.TransformDecision{{State: change(0, "1")}}); err != nil {
		t.Fatal(err)
	}
	if _, v3 := f.counter(); v3 <= v2 {
		t.Errorf("re-created key has version %d, not above %d", v3, v2)
	}
}

// A row that is no longer pending when the hand-off consumes it (an
// operator dead-lettered it meanwhile) must not leave its writes behind.
func TestTransformHandoffWritesOnlyForConsumedRows(t *testing.T) {
	f := newFixture(t)
	r := f.routedRow()
	f.Exec(`UPDATE mefor_work SET status = 'dead', last_error = 'removed from the config' WHERE id = $1`, r.ID)
	err := f.handoff([]pipeline.Row{r}, []pipeline.TransformDecision{{State: change(0, "1")}})
	var c *pipeline.StateConflict
	if !errors.As(err, &c) || !c.RowsChanged {
		t.Fatalf("hand-off of a row dead-lettered under it: %v, want a rows-changed conflict", err)
	}
	if v, _ := f.counter(); v != "" {
		t.Errorf("the row's write was stored: %s", v)
	}
}

func TestPurgeState(t *testing.T) {
	f := newFixture(t)
	f.Exec(`INSERT INTO mefor_state (namespace, key, value, version, updated_at) VALUES
		('n', 'old', '1', nextval('mefor_state_version'), now() - interval '40 days'),
		('n', 'new', '2', nextval('mefor_state_version'), now() - interval '1 day')`)
	n, err := pipeline.PurgeState(f.Ctx, f.DB.Pool, 30*24*time.Hour, 100)
	if err != nil || n != 1 {
		t.Fatalf("purged %d, %v; want 1", n, err)
	}
	if left := f.Int(`SELECT count(*) FROM mefor_state WHERE key = 'new'`); left != 1 {
		t.Error("a recently written value was purged")
	}
}
