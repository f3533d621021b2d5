package dbpool

import (
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// Timeouts are how long one kind of mefor's database work may run one
// statement (statement_timeout) and wait for one lock (lock_timeout).
// Zero means no limit.
//
// Every kind of work mefor does is listed below, with the values it runs
// under, so that they are set and documented in one place
// (docs/operations.md, "Database timeouts"). The two pools set theirs for
// the whole session (CommandConfig, NodeConfig); the kinds that need
// tighter bounds set them for their transaction only (SetLocal,
// SetConfigLocal), over the session's.
type Timeouts struct {
	Statement time.Duration
	Lock      time.Duration
}

var (
	// CommandSession is every session of a CLI command (and of `mefor run`
	// before its node starts: migrations). A statement may run as long as
	// it needs: keys status, a text search and migrations scan whole
	// tables, and the person who ran the command can interrupt it. A lock
	// wait is bounded: an operator's replay or cancel that waits 10s on a
	// lane is stuck behind something, and is better refused than left
	// holding the locks it took meanwhile. CommandIdleInTransaction ends a
	// command's session left idle inside a transaction (a stopped process)
	// so it cannot hold lanes.
	CommandSession = Timeouts{Statement: 0, Lock: 10 * time.Second}

	// NodeSession is every session of a node's pool unless its transaction
	// sets tighter bounds: River's queries, the lease and heartbeat, lane
	// reads, hand-offs and delivery records committed alone, finalizing.
	// None of them runs a statement for long or waits long for a lock in
	// a healthy cluster; past these bounds the statement fails, is logged,
	// and the work is retried (a drainer's job, the next tick), instead of
	// hanging behind a session that will never let go.
	NodeSession = Timeouts{Statement: time.Minute, Lock: 30 * time.Second}

	// Intake is a listener's (and enqueue's) store of received messages. A
	// sender waits for it, and a lock held elsewhere must turn into a
	// refused message (no ACK; the sender sends again) within seconds.
	Intake = Timeouts{Statement: 10 * time.Second, Lock: 5 * time.Second}

	// Handoff is a shared turn of the drainers' route and transform
	// hand-offs and delivery records: one member's lock held elsewhere
	// must not hold the others, who are committed again alone (under
	// NodeSession) when the turn fails.
	Handoff = Timeouts{Statement: 10 * time.Second, Lock: 100 * time.Millisecond}

	// Maintenance is a batch of retention, reference sync or key rotation:
	// a batch may run long (a reference set's copy), but waits only
	// briefly on a lock it did not expect (it skips the ones it expects),
	// failing and leaving the rest for the next run.
	Maintenance = Timeouts{Statement: 10 * time.Minute, Lock: 5 * time.Second}

	// ReferenceSync is the transaction storing a reference set's new
	// snapshot: its copy of the rows may run long, and it waits for
	// another sync of the same set (they serialize on the set's row) as
	// long as a node's session waits for any lock.
	ReferenceSync = Timeouts{Statement: 10 * time.Minute, Lock: 30 * time.Second}
)

// CommandIdleInTransaction is idle_in_transaction_session_timeout for a
// command's sessions: a command never waits for its user inside a
// transaction (confirmations are asked before), so a session idle that
// long belongs to a stopped or frozen process holding locks.
const CommandIdleInTransaction = time.Minute

// SetLocal is the statement setting t for the current transaction only.
func (t Timeouts) SetLocal() string {
	return fmt.Sprintf("SET LOCAL statement_timeout = '%dms'; SET LOCAL lock_timeout = '%dms'",
		t.Statement.Milliseconds(), t.Lock.Milliseconds())
}

// SetConfigLocal is t as set_config calls for the current transaction
// only, to join a SELECT list (one statement of a pipelined batch).
func (t Timeouts) SetConfigLocal() string {
	return fmt.Sprintf("set_config('statement_timeout', '%dms', true), set_config('lock_timeout', '%dms', true)",
		t.Statement.Milliseconds(), t.Lock.Milliseconds())
}

// sessionParams sets t as a session's defaults in params, keeping what the
// database URL set; replacing names values a previous kind set (a node's
// pool starts from the command's configuration), which are replaced too.
func (t Timeouts) sessionParams(params map[string]string, replacing *Timeouts) {
	set := func(name string, d time.Duration, prev *time.Duration) {
		v, ok := params[name]
		if ok && (prev == nil || v != ms(*prev)) {
			return // the URL's own value
		}
		params[name] = ms(d)
	}
	var ps, pl *time.Duration
	if replacing != nil {
		ps, pl = &replacing.Statement, &replacing.Lock
	}
	set("statement_timeout", t.Statement, ps)
	set("lock_timeout", t.Lock, pl)
}

func ms(d time.Duration) string { return strconv.FormatInt(d.Milliseconds(), 10) }

// commandSessions sets CommandSession and CommandIdleInTransaction as cfg's
// session defaults, unless the URL set them.
func commandSessions(cfg *pgconn.Config) {
	if cfg.RuntimeParams == nil {
		cfg.RuntimeParams = map[string]string{}
	}
	CommandSession.sessionParams(cfg.RuntimeParams, nil)
	if _, set := cfg.RuntimeParams["idle_in_transaction_session_timeout"]; !set {
		cfg.RuntimeParams["idle_in_transaction_session_timeout"] = ms(CommandIdleInTransaction)
	}
}
