package ops_test

import (
	"context"
	"testing"
	"time"

	"github.com/mefor/mefor/ops"
	"github.com/mefor/mefor/testcontainers"
)

// A holder killed mid-term leaves its holds_lease flag behind; the node that
// took over flags itself too. The listing must still show one holder: the
// live one.
func TestNodesShowOneHolderTheFreshestLive(t *testing.T) {
	db := testcontainers.NewDB(t)
	ctx := context.Background()
	_, err := db.Pool.Exec(ctx, `
		INSERT INTO mefor_node (id, host, pid, last_seen, status, holds_lease, heartbeat_ms) VALUES
			('crashed', 'h1', 1, clock_timestamp() - interval '10 seconds', 'active', true, 1000),
			('old-flag', 'h2', 2, clock_timestamp() - interval '500 milliseconds', 'active', true, 1000),
			('new', 'h3', 3, clock_timestamp(), 'active', true, 1000),
			('standby', 'h4', 4, clock_timestamp(), 'active', false, 1000),
			('gone', 'h5', 5, clock_timestamp(), 'left', false, 1000)`)
	if err != nil {
		t.Fatal(err)
	}
	nodes, err := ops.ListNodes(ctx, db.Pool)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]ops.Node{}
	holders := 0
	for _, n := range nodes {
		got[n.ID] = n
		if n.HoldsLease {
			holders++
		}
	}
	if holders != 1 || !got["new"].HoldsLease {
		t.Errorf("holders: %d, new holds=%v; want exactly the freshest live node", holders, got["new"].HoldsLease)
	}
	for id, want := range map[string]string{"crashed": "stale", "old-flag": "active", "new": "active", "standby": "active", "gone": "left"} {
		if got[id].Status != want {
			t.Errorf("node %s status %q, want %q", id, got[id].Status, want)
		}
	}

	// The cluster summary reads the lease row itself.
	_, err = db.Pool.Exec(ctx, `INSERT INTO mefor_leader_lease (key, owner, expires_at) VALUES ('listeners', 'new', clock_timestamp() + interval '5 seconds')`)
	if err != nil {
		t.Fatal(err)
	}
	st, err := ops.GetClusterStatus(ctx, db.Pool)
	if err != nil {
		t.Fatal(err)
	}
	if st.LeaseHolder != "new" || st.LeaseExpiresAt == nil || time.Until(*st.LeaseExpiresAt) <= 0 || st.Nodes != 5 || st.ActiveNodes != 3 {
		t.Errorf("cluster status = %+v, want holder new with a future expiry, 5 nodes of which 3 active", st)
	}
	// An expired lease has no holder, whatever the flags say.
	if _, err := db.Pool.Exec(ctx, `UPDATE mefor_leader_lease SET expires_at = '-infinity'`); err != nil {
		t.Fatal(err)
	}
	if st, err = ops.GetClusterStatus(ctx, db.Pool); err != nil || st.LeaseHolder != "" || st.LeaseExpiresAt != nil {
		t.Errorf("after release: %+v, %v; want no holder", st, err)
	}
}
