package pipeline

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/mefor/mefor/internal/dbpool"
	"github.com/mefor/mefor/jobs"
)

// The pipeline's own statements (intake, lane reads, hand-offs, delivery
// records) run with generic plans: planned once per session, not at every
// execution.
//
// PostgreSQL plans a prepared statement anew for each execution as long as
// a plan made for the values at hand is estimated cheaper than one made for
// any value. For these statements it always is (an unnest of a one-element
// array against one of ten; a lane known to be short), so every execution
// was planned, and planning cost the server several times more than
// running them. Their plans need no values: each reaches its rows through
// the ids or the lane it is given, by an index (TestPipelineStatementsPlanOnce checks that
// none scans mefor_work or mefor_message). Parallel workers are off with
// them, as a plan for any lane assumes a long one and would start workers
// for it. So are sequential scans where an index serves: a plan is kept
// until the next ANALYZE of its tables, and one made while a new install's
// tables were nearly empty would otherwise scan them as they grow. And JIT
// compilation is off: a scan made that dear pushes a plan's estimate past
// jit_above_cost, as can the estimate of a generic plan for a long lane,
// and compiling costs far more than a lane read that runs in well under a
// millisecond.
//
// The settings last for the transaction only. Maintenance, River's own
// queries and operators' commands keep PostgreSQL's choice: their plans do
// depend on the values (a time bound, a state, a status that is rare).
var pipelineSettings = []struct{ name, value string }{
	{"plan_cache_mode", "force_generic_plan"},
	{"max_parallel_workers_per_gather", "0"},
	{"enable_seqscan", "off"},
	{"jit", "off"},
}

// PipelineTx begins a transaction of the pipeline's own statements, with
// generic plans, in the one round trip of its BEGIN.
var PipelineTx = pgx.TxOptions{BeginQuery: pipelineSQL("BEGIN", "SET LOCAL %s = %s")}

// PipelineTxTimeouts is PipelineTx under the timeouts t (statement_timeout
// and lock_timeout, for the transaction only; dbpool lists the kinds), in
// the same round trip: a statement that would wait longer for a lock fails
// with lock_not_available (55P03). Work shared by several callers uses it,
// so that one caller's lock held elsewhere cannot hold the others.
func PipelineTxTimeouts(t dbpool.Timeouts) pgx.TxOptions {
	return pgx.TxOptions{BeginQuery: PipelineTx.BeginQuery + "; " + t.SetLocal()}
}

// intakeSettingsSQL is setConfigSQL with the dbpool.Intake timeouts, first
// in intake's one-trip batch: a lock held elsewhere (a lane an operator's
// open transaction holds, say) fails the store with lock_not_available
// within the timeout, and the sender gets no ACK, instead of every sender
// of the channel waiting with no end.
var intakeSettingsSQL = setConfigSQL + ", " + dbpool.Intake.SetConfigLocal()

// IsLockTimeout says err is a statement that waited its lock_timeout out
// (SQLSTATE 55P03, lock_not_available).
func IsLockTimeout(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "55P03"
}

// QueueGenericPlans queues, first in a batch sent outside a transaction
// block, what PipelineTx sets: the batch is one implicit transaction, and
// its statements after this one plan generically.
func QueueGenericPlans(b *pgx.Batch) { b.Queue(setConfigSQL) }

// setConfigSQL is pipelineSettings as one statement of transaction-local
// set_config calls.
var setConfigSQL = "SELECT " + strings.Join(pipelineStmts("set_config('%s', '%s', true)"), ", ")

// pipelineSQL is head followed by one statement per setting, as format
// gives it, in one simple-protocol string.
func pipelineSQL(head, format string) string {
	return strings.Join(append([]string{head}, pipelineStmts(format)...), "; ")
}

func pipelineStmts(format string) []string {
	out := make([]string, len(pipelineSettings))
	for i, st := range pipelineSettings {
		out[i] = fmt.Sprintf(format, st.name, st.value)
	}
	return out
}

// warmStatements load into a new session, without reading or writing a
// row, what the pipeline's first statements there would otherwise load
// while a sender waits: the descriptions of the pipeline's tables and
// their indexes (planning a statement opens every index of its tables),
// and the count triggers' functions, compiled on their first call (a
// statement-level trigger fires for a statement that changes no row).
// TestWarmSessionChangesNothing runs them.
var warmStatements = []string{
	`SELECT 1 FROM mefor_message m, mefor_work w, mefor_event e, mefor_response r,
		mefor_work_count wc, mefor_message_count mc WHERE false`,
	jobs.WarmSQL,
	`UPDATE mefor_message SET status = status WHERE false`,
	`UPDATE mefor_work SET status = status WHERE false`,
}

// warmLockWait bounds each warm statement's wait for a table lock (a
// migration's, say): warming is worth less than a session.
const warmLockWait = 100 * time.Millisecond

// WarmSession readies a new session for the pipeline (warmStatements), in
// one round trip and one transaction it rolls back. It is best effort: on
// a database not yet migrated, or a table locked longer than warmLockWait,
// the session is simply cold, and the error is returned for the caller to
// log. Errors never carry message content: the statements read no row.
func WarmSession(ctx context.Context, conn *pgx.Conn) error {
	sql := fmt.Sprintf("BEGIN; SET LOCAL lock_timeout = '%dms'; %s; ROLLBACK",
		warmLockWait.Milliseconds(), strings.Join(warmStatements, "; "))
	_, err := conn.Exec(ctx, sql)
	if conn.PgConn().TxStatus() != 'I' {
		// A statement failed: the rest of the string was skipped, and the
		// transaction is still open.
		if _, rbErr := conn.Exec(ctx, "ROLLBACK"); rbErr != nil && err == nil {
			err = rbErr
		}
	}
	if err != nil {
		return fmt.Errorf("warm session: %w", err)
	}
	return nil
}
