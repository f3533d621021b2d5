// Package audit keeps mefor_audit, the tamper-evident log of operator
// actions: who (OS user, database role, host, node), what, on which target,
// with which outcome, and never message content.
//
// # The chain
//
// Each row's hash is SHA-256 over a canonical encoding of its fields and the
// previous row's hash (see rowHash; the server computes the same in
// mefor_audit_row_hash), and rows are numbered 1, 2, 3, ... by seq. Altering a row changes its hash, so the next row's prev_hash no
// longer matches; deleting one leaves a gap; Verify names the first row
// where either shows. Cutting rows off the end leaves a valid shorter
// chain, which only an anchor kept elsewhere exposes: Head gives the last
// row's seq and hash, and Verify with that anchor checks that the row is
// still there, unchanged.
//
// The chain alone is unkeyed: whoever can write the table (a database
// superuser) can rewrite it consistently. Anchors make that visible (see
// anchor.go): the leader's audit_anchor job records the head with an HMAC
// under MEFOR_AUDIT_KEY over it and the previous anchor, and Verify with
// the key checks every anchor, so a rewrite, an insert or a deletion before
// the latest anchor is caught by anyone holding the key, and an anchored
// row cut off the end is caught even without it.
//
// # Writers
//
// No role may INSERT, UPDATE or DELETE mefor_audit. Append calls
// mefor_audit_append, a SECURITY DEFINER function owned by
// mefor_audit_writer, which locks the table, reads the head and inserts the
// next row, so two writers cannot fork the chain and no caller chooses seq,
// time, role or hash. Callers append in the transaction of the action
// itself, as its last statement: the row commits if and only if the action
// does, and the lock, the last one the transaction takes, is held only
// until its commit.
package audit

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/user"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/mefor/mefor/internal/dbpool"
	"github.com/mefor/mefor/migrations"
)

// Actions recorded in mefor_audit.action.
const (
	ActionReplay         = "replay"
	ActionReplayDead     = "replay-dead"
	ActionCancel         = "cancel"
	ActionStepdown       = "stepdown"
	ActionReload         = "reload"
	ActionMaintenanceRun = "maintenance-run"
	ActionKeysRotate     = "keys-rotate"
	ActionViewBody       = "view-body"
	// ActionSearchBodies is messages list --text: it reads bodies to
	// match them.
	ActionSearchBodies = "search-bodies"
	// ActionSearchPatient is messages list --patient: it tells who was
	// treated where. The row never holds the identifier searched for.
	ActionSearchPatient = "search-patient"
	// ActionViewErrors is messages show and dead list opening sealed
	// error and event texts, which can quote the message.
	ActionViewErrors = "view-errors"
	// ActionViewReference is reference show: it opens reference values.
	ActionViewReference = "view-reference"
	// ActionEnqueue is mefor enqueue: an operator's message stored as if
	// a channel had received it.
	ActionEnqueue = "enqueue"

	// People and their credentials (package identity). Every login
	// attempt is recorded, its outcome ok, failed or denied; never a
	// password, TOTP or recovery code, or token.
	ActionLogin          = "login"
	ActionLogout         = "logout"
	ActionUserAdd        = "user-add"
	ActionUserSet        = "user-set"
	ActionUserDisable    = "user-disable"
	ActionUserEnable     = "user-enable"
	ActionUserDelete     = "user-delete"
	ActionUserResetMFA   = "user-reset-mfa"
	ActionSessionsRevoke = "sessions-revoke"
	ActionTokenCreate    = "token-create"
	ActionTokenRevoke    = "token-revoke"
	// ActionReauth is a session's re-authentication (POST
	// /api/v1/reauth), its outcome ok or failed.
	ActionReauth = "reauth"

	// Dual control (package approval): an action access.approvals names
	// is requested by one person and approved or rejected by another;
	// every row names both.
	ActionApprovalRequest = "approval-request"
	ActionApprovalApprove = "approval-approve"
	ActionApprovalReject  = "approval-reject"
)

// Outcomes. A failed action records OutcomeFailed with the error in the
// target's "error" field; one the database refused for lack of privilege,
// OutcomeDenied.
const (
	OutcomeOK        = "ok"
	OutcomeRequested = "requested"
	OutcomeFailed    = "failed"
	OutcomeDenied    = "denied"
)

// Entry is one action to record.
type Entry struct {
	Action string
	// Target says what was acted on: ids, destination, filters, counts.
	// Never message content.
	Target map[string]any
	// Outcome is OutcomeOK unless set.
	Outcome string
	// Node is the node that acted, for node-side actions.
	Node string
	// Actor is the mefor user who acted or tried to (a login's user
	// name), recorded as the target's "actor" field so that the row
	// names a person, not only a database role.
	Actor string
}

// DBTX is what the writers and readers need: a transaction, a connection
// or a pool.
type DBTX = dbpool.DBTX

// Record is one row of the log.
type Record struct {
	Seq    int64     `json:"seq"`
	At     time.Time `json:"at"`
	OSUser string    `json:"os_user"`
	DBRole string    `json:"db_role"`
	Host   string    `json:"host"`
	Node   string    `json:"node,omitempty"`
	// Actor is the mefor user who acted (Entry.Actor, kept in the
	// target), when a person did; List fills it in.
	Actor    string          `json:"actor,omitempty"`
	Action   string          `json:"action"`
	Target   json.RawMessage `json:"target"`
	Outcome  string          `json:"outcome"`
	PrevHash string          `json:"prev_hash"`
	Hash     string          `json:"hash"`
}

// Append records e in tx, chained to the current head. Call it last in the
// action's transaction (see the package doc).
func Append(ctx context.Context, tx pgx.Tx, e Entry) error {
	if e.Action == "" {
		return errors.New("audit: entry without an action")
	}
	if e.Outcome == "" {
		e.Outcome = OutcomeOK
	}
	origin := OriginOf(ctx)
	if e.Actor == "" {
		e.Actor = origin.Actor
	}
	if e.Actor != "" {
		t := make(map[string]any, len(e.Target)+6)
		for k, v := range origin.fields() {
			t[k] = v
		}
		for k, v := range e.Target {
			t[k] = v
		}
		t["actor"] = e.Actor
		e.Target = t
	}
	target, err := canonicalTarget(e.Target)
	if err != nil {
		return fmt.Errorf("audit %s: %w", e.Action, err)
	}
	// The server draws seq, reads the previous hash, stamps the time and
	// the login, and computes the hash (mefor_audit_append): no role may
	// write the table itself.
	_, err = tx.Exec(ctx, `SELECT mefor_audit_append($1, $2, $3, $4, $5, $6)`,
		osUser(), hostname(), e.Node, e.Action, string(target), e.Outcome)
	if err != nil {
		return fmt.Errorf("audit %s: %w", e.Action, err)
	}
	return nil
}

// DefinerTarget is target as Append records it (with the origin of ctx:
// actor, source, session or token, approval),
// encoded, for the SECURITY DEFINER functions that
// append their audit row themselves (the operator writes of migration 024)
// and merge what they did into it.
func DefinerTarget(ctx context.Context, target map[string]any) (string, error) {
	origin := OriginOf(ctx)
	t := make(map[string]any, len(target)+6)
	if origin.Actor != "" {
		for k, v := range origin.fields() {
			t[k] = v
		}
	}
	for k, v := range target {
		t[k] = v
	}
	if origin.Actor != "" {
		t["actor"] = origin.Actor
	}
	b, err := canonicalTarget(t)
	if err != nil {
		return "", err
	}
	return string(b), nil
}

// Beginner starts transactions: a pool or a connection.
type Beginner interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// AppendAlone records e in a transaction of its own, for an outcome known
// only after the action's own transaction ended (it failed, or it was
// refused).
func AppendAlone(ctx context.Context, db Beginner, e Entry) error {
	return pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error { return Append(ctx, tx, e) })
}

// Failure is the entry recording that action on target failed with err; a
// refusal for lack of privilege is OutcomeDenied.
func Failure(action string, target map[string]any, err error) Entry {
	t := make(map[string]any, len(target)+1)
	for k, v := range target {
		t[k] = v
	}
	outcome := OutcomeFailed
	if migrations.IsPermissionDenied(err) {
		outcome = OutcomeDenied
	}
	msg := err.Error()
	if len(msg) > 500 {
		msg = msg[:500]
	}
	t["error"] = msg
	return Entry{Action: action, Target: t, Outcome: outcome}
}

// canonicalTarget is the target as JSON with sorted keys (encoding/json
// sorts map keys), the exact bytes stored and hashed.
func canonicalTarget(t map[string]any) (json.RawMessage, error) {
	if t == nil {
		t = map[string]any{}
	}
	b, err := json.Marshal(t)
	if err != nil {
		return nil, fmt.Errorf("encode target: %w", err)
	}
	return b, nil
}

// hashVersion starts every hashed encoding, so a future change of the
// encoding can be told apart.
const hashVersion = "mefor-audit-v1"

// rowHash is SHA-256 over the row's fields, each length-prefixed so no two
// different rows encode alike, ending with the previous row's hash.
func rowHash(r Record) string {
	h := sha256.New()
	writeFields(h, hashVersion, strconv.FormatInt(r.Seq, 10), r.At.UTC().Format("2006-01-02T15:04:05.000000Z"),
		r.OSUser, r.DBRole, r.Host, r.Node, r.Action, string(r.Target), r.Outcome, r.PrevHash)
	return hex.EncodeToString(h.Sum(nil))
}

// writeFields writes each field length-prefixed (an unsigned varint).
func writeFields(w io.Writer, fields ...string) {
	for _, s := range fields {
		var n [binary.MaxVarintLen64]byte
		_, _ = w.Write(n[:binary.PutUvarint(n[:], uint64(len(s)))])
		_, _ = io.WriteString(w, s)
	}
}

// osUser is the operating system user running this process.
func osUser() string {
	if u, err := user.Current(); err == nil && u.Username != "" {
		return u.Username
	}
	if u := os.Getenv("USER"); u != "" {
		return u
	}
	return "uid " + strconv.Itoa(os.Getuid())
}

func hostname() string {
	h, err := os.Hostname()
	if err != nil || h == "" {
		return "unknown"
	}
	return h
}

// Who is the operating system user and host of this process, as the audit
// rows record them, for the functions that append an audit row in the
// server (mefor_read_body).
func Who() (osUserName, host string) { return osUser(), hostname() }
