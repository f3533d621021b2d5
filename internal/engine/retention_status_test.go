package engine_test

import (
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/mefor/mefor/ops"
	"github.com/mefor/mefor/testcontainers"
	"github.com/mefor/mefor/testcontainers/cluster"
	"github.com/mefor/mefor/testcontainers/fixtures"
)

// `mefor status` shows the retention the live nodes run with: keep_errors'
// default without a retention block, marked as the default, and what the
// file says once a reload applies a block.
func TestStatusShowsRetentionPolicy(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testcontainers.NewDB(t)
	listen := fixtures.FreeAddr(t)
	base := fixtures.ADTChannel(listen) + `
      - destinations: [out]
destinations:
  out: {type: file, file: {directory: ` + t.TempDir() + `}}
`
	path, cfg := configFile(t, "mefor.yaml", base)
	n := cluster.StartNode(t, db, cfg, named("retention-node"))

	policy := func() []nodeinfoRetention {
		st, err := ops.Status(ctx, db.Pool)
		if err != nil {
			t.Fatal(err)
		}
		var out []nodeinfoRetention
		for _, p := range st.Retention.Policies {
			out = append(out, nodeinfoRetention{p.KeepBodiesSeconds, p.KeepDeadSeconds, p.KeepErrorsSeconds, p.KeepErrorsDefault, strings.Join(p.Nodes, ",")})
		}
		return out
	}
	const day = 24 * 60 * 60
	if got, want := policy(), []nodeinfoRetention{{0, 0, 30 * day, true, "retention-node"}}; !slices.Equal(got, want) {
		t.Fatalf("status without a retention block: %+v, want %+v", got, want)
	}

	writeFile(t, path, base+`maintenance:
  retention: {keep_bodies: 10d, keep_errors: 14d}
`)
	if _, err := n.Reload(ctx); err != nil {
		t.Fatal(err)
	}
	if got, want := policy(), []nodeinfoRetention{{10 * day, 10 * day, 14 * day, false, "retention-node"}}; !slices.Equal(got, want) {
		t.Fatalf("status after the reload: %+v, want %+v", got, want)
	}
}

// nodeinfoRetention is a recorded policy and its nodes, comparable.
type nodeinfoRetention struct {
	keepBodies, keepDead, keepErrors int64
	keepErrorsDefault                bool
	nodes                            string
}
