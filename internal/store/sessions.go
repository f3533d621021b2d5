package store

import "github.com/jackc/pgx/v5/pgconn"

// DurableCommits makes the sessions of a connection configuration wait for
// their commits to be flushed: synchronous_commit "on", unless the
// configuration already names a value (a synchronous_commit=... parameter
// of the database URL, e.g. remote_apply). A server or database whose
// default is "off" would otherwise let a commit return, and the sender be
// acknowledged, before the message is on disk, and a database crash would
// then lose acknowledged messages.
func DurableCommits(cfg *pgconn.Config) {
	if cfg.RuntimeParams == nil {
		cfg.RuntimeParams = map[string]string{}
	}
	if _, set := cfg.RuntimeParams["synchronous_commit"]; !set {
		cfg.RuntimeParams["synchronous_commit"] = "on"
	}
}
