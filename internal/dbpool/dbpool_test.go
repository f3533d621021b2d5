package dbpool

import (
	"errors"
	"strings"
	"testing"
	"time"
)

// A command's pool commits durably and is sized for a node unless the URL
// says otherwise; a URL that does not parse is refused without echoing it.
func TestCommandConfig(t *testing.T) {
	t.Parallel()
	cfg, err := CommandConfig("postgres://u:pw@db.example:5432/mefor")
	if err != nil {
		t.Fatal(err)
	}
	if cfg.MaxConns != DefaultMaxConns || cfg.ConnConfig.RuntimeParams["synchronous_commit"] != "on" {
		t.Fatalf("max_conns %d, synchronous_commit %q; want %d and on", cfg.MaxConns,
			cfg.ConnConfig.RuntimeParams["synchronous_commit"], DefaultMaxConns)
	}
	cfg, err = CommandConfig("postgres://u:pw@db.example:5432/mefor?pool_max_conns=3&synchronous_commit=remote_apply")
	if err != nil {
		t.Fatal(err)
	}
	if cfg.MaxConns != 3 || cfg.ConnConfig.RuntimeParams["synchronous_commit"] != "remote_apply" {
		t.Fatalf("max_conns %d, synchronous_commit %q; want the URL's 3 and remote_apply", cfg.MaxConns,
			cfg.ConnConfig.RuntimeParams["synchronous_commit"])
	}
	_, err = CommandConfig("postgres://u:s3cret@db.example:notaport/mefor")
	if !errors.Is(err, ErrInvalidURL) || strings.Contains(err.Error(), "s3cret") {
		t.Fatalf("invalid URL: %v", err)
	}
}

// A node's configuration names and bounds its sessions and commits
// durably, keeping an idle timeout the URL sets, and leaves base as it was.
func TestNodeConfig(t *testing.T) {
	t.Parallel()
	base, err := CommandConfig("postgres://u:pw@db.example:5432/mefor")
	if err != nil {
		t.Fatal(err)
	}
	before := len(base.ConnConfig.RuntimeParams)
	cfg := NodeConfig(base, NodeOptions{ApplicationName: "mefor n1", LeaseTTL: 5 * time.Second})
	p := cfg.ConnConfig.RuntimeParams
	if p["application_name"] != "mefor n1" || p["idle_in_transaction_session_timeout"] != "5000" || p["synchronous_commit"] != "on" {
		t.Fatalf("node session parameters %v", p)
	}
	if cfg.AfterConnect == nil || len(base.ConnConfig.RuntimeParams) != before {
		t.Fatalf("base changed (%v) or no session readying", base.ConnConfig.RuntimeParams)
	}
	base.ConnConfig.RuntimeParams["idle_in_transaction_session_timeout"] = "1000"
	if got := NodeConfig(base, NodeOptions{LeaseTTL: 5 * time.Second}).ConnConfig.RuntimeParams["idle_in_transaction_session_timeout"]; got != "1000" {
		t.Fatalf("idle_in_transaction_session_timeout %q, want the URL's 1000", got)
	}
}
