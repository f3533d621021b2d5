package pipeline_test

import (
	"reflect"
	"testing"

	"github.com/mefor/mefor/internal/pipeline"
	"github.com/mefor/mefor/testcontainers/fixtures"
)

// A read of several lanes at once answers each lane exactly as that lane's
// own read does: its rows after the seq asked, head first, at most its
// limit, the layout barrier applied to a delivery lane (d's rows queue
// behind the older row of d~1, another generation of the same
// destination), route lanes and delivery lanes mixed, an empty lane empty.
func TestReadsOfSeveralLanesAnswerEachLane(t *testing.T) {
	ctx, db, ins := laneTest(t)

	for _, lane := range []string{"outbound:a", "outbound:b", "outbound:a", "outbound:d~1", "outbound:b", "outbound:a", "outbound:d", "outbound:a", "outbound:d"} {
		fixtures.Queue(t, db, ins, lane)
	}
	for range 3 {
		received(t, db, "c1")
	}
	b, err := pipeline.PendingRows(ctx, db.Pool, "outbound:b", 10)
	if err != nil || len(b) != 2 {
		t.Fatalf("lane b: %v %v", b, err)
	}
	reads := []pipeline.LaneRead{
		{Lane: "outbound:a", Limit: 3},
		{Lane: "ingress:c1", Limit: 10},
		{Lane: "outbound:b", After: b[0].Seq, Limit: 10},
		{Lane: "outbound:d", Limit: 10},
		{Lane: "outbound:empty", Limit: 5},
		{Lane: "ingress:c1", After: 0, Limit: 2},
	}
	got, err := pipeline.PendingRowsOfLanes(ctx, db.Pool, reads)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(reads) {
		t.Fatalf("%d answers to %d reads", len(got), len(reads))
	}
	wantLen := []int{3, 3, 1, 2, 0, 2}
	for i, r := range reads {
		alone, err := pipeline.PendingRowsAfter(ctx, db.Pool, r.Lane, r.After, r.Limit)
		if err != nil {
			t.Fatal(err)
		}
		if len(got[i]) != wantLen[i] || !reflect.DeepEqual(got[i], alone) && len(alone) > 0 {
			t.Errorf("read %d (%s after %d, %d at most): %d rows %+v\nread alone: %d rows %+v", i, r.Lane, r.After, r.Limit,
				len(got[i]), got[i], len(alone), alone)
		}
		for j := 1; j < len(got[i]); j++ {
			if got[i][j].Seq <= got[i][j-1].Seq {
				t.Errorf("read %d (%s): rows out of order: seq %d after %d", i, r.Lane, got[i][j].Seq, got[i][j-1].Seq)
			}
		}
		for _, w := range got[i] {
			if w.Lane != r.Lane {
				t.Errorf("read %d (%s) answered with a row of %s", i, r.Lane, w.Lane)
			}
			if w.Held != (r.Lane == "outbound:d") {
				t.Errorf("read %d (%s): row %d held %v, want held only in lane d (behind d~1)", i, r.Lane, w.Seq, w.Held)
			}
		}
	}
}
