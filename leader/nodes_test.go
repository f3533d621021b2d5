package leader

import (
	"context"
	"slices"
	"testing"

	"github.com/mefor/mefor/testcontainers"
)

// Each node is judged by the timings it recorded when it joined: a node
// silent for 5s is dead if its node_timeout is 3s, and only stale if it is a
// minute, whatever any reader's config says. A node that left is dead at
// once. Every reader agrees: the dead list reclaim uses, the live flag of the
// config status, the node listing.
func TestNodesJudgedByTheirOwnTimeouts(t *testing.T) {
	t.Parallel()
	db := testcontainers.NewDB(t)
	ctx := context.Background()
	if _, err := db.Pool.Exec(ctx, `
		INSERT INTO mefor_node (id, host, pid, last_seen, status, heartbeat_ms, node_timeout_ms) VALUES
			('short', 'h', 1, clock_timestamp() - interval '5 seconds', 'active', 1000, 3000),
			('long', 'h', 2, clock_timestamp() - interval '5 seconds', 'active', 1000, 60000),
			('fresh', 'h', 3, clock_timestamp(), 'active', 1000, 3000),
			('gone', 'h', 4, clock_timestamp(), 'left', 1000, 60000)`); err != nil {
		t.Fatal(err)
	}
	dead, err := DeadNodes(ctx, db.Pool)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"gone", "short"}; !slices.Equal(dead, want) {
		t.Errorf("dead nodes %v, want %v", dead, want)
	}
	st, err := ReadConfigStatus(ctx, db.Pool)
	if err != nil {
		t.Fatal(err)
	}
	live := map[string]bool{}
	for _, n := range st.Nodes {
		live[n.Node] = n.Live
	}
	for id, want := range map[string]bool{"short": false, "long": true, "fresh": true, "gone": false} {
		if live[id] != want {
			t.Errorf("config status: node %s live %v, want %v", id, live[id], want)
		}
	}
	nodes, err := ListNodes(ctx, db.Pool)
	if err != nil {
		t.Fatal(err)
	}
	status := map[string]string{}
	for _, n := range nodes {
		status[n.ID] = n.Status
	}
	for id, want := range map[string]string{"short": NodeStale, "long": NodeStale, "fresh": NodeActive, "gone": NodeLeft} {
		if status[id] != want {
			t.Errorf("listing: node %s %s, want %s", id, status[id], want)
		}
	}
}
