package ops

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/mefor/mefor/internal/audit"
	"github.com/mefor/mefor/internal/config"
	"github.com/mefor/mefor/leader"
)

// ConfigReport is the cluster config version and every known node's
// applied config, as ConfigStatus returns it.
type ConfigReport = leader.ConfigStatus

// BumpConfig tells every node to reload its config file: it raises the
// cluster config version, recording the hash of cfg (the file the operator
// validated) as the one every node is expected to run, and notifies the
// nodes. by says who asked, for `mefor status`. cfg must come from
// config.Load: an invalid file is never announced.
func BumpConfig(ctx context.Context, pool *pgxpool.Pool, cfg *config.Config, by string) (int64, error) {
	var v int64
	target := map[string]any{"config_hash": cfg.Hash(), "file": cfg.File}
	err := audited(ctx, pool, pgx.TxOptions{}, audit.ActionReload, target, func(tx pgx.Tx) (string, error) {
		var err error
		v, err = leader.BumpClusterConfig(ctx, tx, cfg.Hash(), by)
		target["version"] = v
		return audit.OutcomeRequested, err
	})
	return v, err
}

// ConfigStatus returns the cluster config version and each node's applied
// config, flagging nodes behind the version or running another file. Dead
// nodes (by each node's own node_timeout) are listed as not live.
func ConfigStatus(ctx context.Context, pool *pgxpool.Pool) (*leader.ConfigStatus, error) {
	return readValue(ctx, pool, leader.ReadConfigStatus)
}

// Node reload states, as WaitConfig reports them.
const (
	ReloadApplied       = "applied"        // runs the version, with the expected file
	ReloadDifferentFile = "different-file" // runs the version, but its own file differs
	ReloadFailed        = "failed"         // refused the version; Reason says why
	ReloadPending       = "pending"        // has not answered yet
)

// NodeReload is one live node's answer to a reload.
type NodeReload struct {
	Node           string `json:"node"`
	State          string `json:"state"`
	AppliedVersion *int64 `json:"applied_version"`
	Hash           string `json:"hash,omitempty"`
	Reason         string `json:"reason,omitempty"`
}

// ConfigWait is where a reload stands across the cluster.
type ConfigWait struct {
	Version int64  `json:"version"`
	Hash    string `json:"hash"`
	// Converged is true when every live node applied the version with the
	// expected file.
	Converged bool         `json:"converged"`
	Nodes     []NodeReload `json:"nodes"`
}

// Settled reports whether every live node has answered, one way or the
// other.
func (w *ConfigWait) Settled() bool {
	for _, n := range w.Nodes {
		if n.State == ReloadPending {
			return false
		}
	}
	return true
}

// WaitConfig polls the nodes until every live one applied version or
// recorded why it could not, or ctx ends; it then returns where each node
// stands (an ended ctx is not an error: the pending nodes say it).
func WaitConfig(ctx context.Context, pool *pgxpool.Pool, version int64, hash string, poll time.Duration) (*ConfigWait, error) {
	for {
		st, err := ConfigStatus(ctx, pool)
		if err != nil {
			if ctx.Err() != nil {
				return &ConfigWait{Version: version, Hash: hash}, nil
			}
			return nil, err
		}
		w := configWait(st, version, hash)
		if w.Settled() {
			return w, nil
		}
		select {
		case <-ctx.Done():
			return w, nil
		case <-time.After(poll):
		}
	}
}

func configWait(st *leader.ConfigStatus, version int64, hash string) *ConfigWait {
	w := &ConfigWait{Version: version, Hash: hash, Converged: true, Nodes: []NodeReload{}}
	for _, n := range st.Nodes {
		if !n.Live {
			continue
		}
		r := NodeReload{Node: n.Node, AppliedVersion: n.Version, Hash: n.Hash}
		switch {
		case n.Version != nil && *n.Version >= version && n.Hash == hash:
			r.State = ReloadApplied
		case n.Version != nil && *n.Version >= version:
			r.State = ReloadDifferentFile
			r.Reason = "its config file differs from the one validated here (hash " + shortHash(n.Hash) + ", expected " + shortHash(hash) + ")"
		case n.ErrorVersion != nil && *n.ErrorVersion >= version:
			r.State, r.Reason = ReloadFailed, n.Error
		default:
			r.State = ReloadPending
		}
		if r.State != ReloadApplied {
			w.Converged = false
		}
		w.Nodes = append(w.Nodes, r)
	}
	return w
}

func shortHash(h string) string {
	if len(h) > 12 {
		return h[:12]
	}
	return h
}
