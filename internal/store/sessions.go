package store

// DurableCommits makes the sessions of a connection configuration wait for
// their commits to be flushed: synchronous_commit "on", unless the
// configuration already names a value (a synchronous_commit=... parameter
// of the database URL, e.g. remote_apply). A server or database whose
// default is "off" would otherwise let a commit return, and the sender be
// acknowledged, before the message is on disk, and a database crash would
// then lose acknowledged messages. params is a pgx RuntimeParams map.
func DurableCommits(params map[string]string) {
	if _, set := params["synchronous_commit"]; !set {
		params["synchronous_commit"] = "on"
	}
}
