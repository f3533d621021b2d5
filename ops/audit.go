package ops

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/mefor/mefor/internal/audit"
	"github.com/mefor/mefor/internal/pipeline"
)

// audited runs fn in a transaction whose last statement appends the audit
// row of action on target, so the row commits exactly when the action does.
// fn may add to target (counts known only once it ran); it returns the
// outcome to record ("" means ok; noAudit: the transaction changed
// nothing, and no row is written). When fn or the commit fails, the failure
// is recorded in a transaction of its own, best effort: the caller gets the
// action's error either way.
func audited(ctx context.Context, pool *pgxpool.Pool, opts pgx.TxOptions, action string, target map[string]any,
	fn func(tx pgx.Tx) (string, error)) error {
	err := pgx.BeginTxFunc(ctx, pool, opts, func(tx pgx.Tx) error {
		outcome, err := fn(tx)
		if err != nil || outcome == noAudit {
			return err
		}
		return audit.Append(ctx, tx, audit.Entry{Action: action, Target: target, Outcome: outcome})
	})
	if err != nil {
		recordFailure(ctx, pool, action, target, err)
	}
	return err
}

// auditedInDB runs fn in a transaction for an operator write that goes
// through a function of migration 024, which appends the audit row of
// action itself, last, with what it did merged into target: a carries who
// acted and target for fn to pass on. When fn or the commit fails, the
// failure is recorded as audited records it.
func auditedInDB(ctx context.Context, pool *pgxpool.Pool, action string, target map[string]any,
	fn func(tx pgx.Tx, a pipeline.Audit) error) error {
	t, err := audit.DefinerTarget(ctx, target)
	if err != nil {
		return fmt.Errorf("audit %s: %w", action, err)
	}
	osUser, host := audit.Who()
	a := pipeline.Audit{OSUser: osUser, Host: host, Target: t}
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return fn(tx, a) })
	if err != nil {
		recordFailure(ctx, pool, action, target, err)
	}
	return err
}

// noAudit is the outcome of a transaction that changed nothing worth a row
// (the empty batch that ends a bulk run).
const noAudit = "-"

// recordFailure appends the failure of action, even when ctx ended (an
// interrupted bulk run is worth a row), within a few seconds.
func recordFailure(ctx context.Context, pool *pgxpool.Pool, action string, target map[string]any, err error) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	_ = audit.AppendAlone(ctx, pool, audit.Failure(action, target, err))
}

// Audit log types, as ops returns them.
type (
	// AuditFilter narrows ListAudit. Empty fields do not filter.
	AuditFilter = audit.Filter
	// AuditRecord is one row of the audit log.
	AuditRecord = audit.Record
	// AuditAnchor is a row's number and hash, kept outside the database
	// to prove later that no row up to it changed.
	AuditAnchor = audit.Anchor
	// AuditVerification is the outcome of VerifyAudit.
	AuditVerification = audit.Verification
	// AuditKeys are the keys of MEFOR_AUDIT_KEY, which sign and check the
	// stored anchors.
	AuditKeys = audit.Keys
)

// AuditKeysFromEnv reads MEFOR_AUDIT_KEY through lookup (nil: unset).
func AuditKeysFromEnv(lookup func(string) (string, bool)) (*AuditKeys, error) {
	return audit.KeysFromEnv(lookup)
}

// AuditedActions lists the actions the audit log records, in the order the
// CLI names them.
func AuditedActions() []string {
	return []string{audit.ActionReplay, audit.ActionReplayDead, audit.ActionCancel, audit.ActionStepdown,
		audit.ActionReload, audit.ActionMaintenanceRun, audit.ActionKeysRotate, audit.ActionViewBody, audit.ActionSearchBodies,
		audit.ActionSearchPatient, audit.ActionViewErrors, audit.ActionViewReference, audit.ActionEnqueue,
		audit.ActionLogin, audit.ActionLogout, audit.ActionUserAdd, audit.ActionUserSet, audit.ActionUserDisable,
		audit.ActionUserEnable, audit.ActionUserDelete, audit.ActionUserResetMFA, audit.ActionSessionsRevoke,
		audit.ActionTokenCreate, audit.ActionTokenRevoke, audit.ActionReauth, audit.ActionApprovalRequest,
		audit.ActionApprovalApprove, audit.ActionApprovalReject}
}

// ParseAuditAnchor reads an anchor written as SEQ:HASH.
func ParseAuditAnchor(s string) (AuditAnchor, error) { return audit.ParseAnchor(s) }

// ListAudit returns audit log rows, newest first.
func ListAudit(ctx context.Context, pool *pgxpool.Pool, f AuditFilter) ([]AuditRecord, error) {
	return audit.List(ctx, pool, f)
}

// VerifyAudit recomputes the hash chain of the whole log, checks the stored
// anchors (their signatures under keys, when given) and who may write the
// log, and, given an anchor, checks that its row is still there unchanged.
func VerifyAudit(ctx context.Context, pool *pgxpool.Pool, anchor *AuditAnchor, keys *AuditKeys) (AuditVerification, error) {
	return audit.VerifyWith(ctx, pool, audit.VerifyOptions{Anchor: anchor, Keys: keys})
}

// AuditHead returns the anchor of the log's last row.
func AuditHead(ctx context.Context, pool *pgxpool.Pool) (AuditAnchor, error) {
	return audit.Head(ctx, pool)
}
