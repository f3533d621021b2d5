package audit

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/mefor/mefor/internal/dbpool"
)

// Filter narrows List. Empty fields do not filter.
type Filter struct {
	Since  time.Time
	Action string
	// Limit is how many rows, newest first. Defaults to 100 when not
	// positive.
	Limit int
}

// List returns log rows, newest first.
func List(ctx context.Context, q DBTX, f Filter) ([]Record, error) {
	limit := f.Limit
	if limit <= 0 {
		limit = 100
	}
	var since *time.Time
	if !f.Since.IsZero() {
		since = &f.Since
	}
	out, err := dbpool.Rows(ctx, q, "read the audit log", scanRecord, `
		SELECT `+recordColumns+`
		FROM mefor_audit
		WHERE ($1::timestamptz IS NULL OR at >= $1) AND ($2 = '' OR action = $2)
		ORDER BY seq DESC
		LIMIT $3`, since, f.Action, limit)
	if err != nil {
		return nil, err
	}
	for i := range out {
		var t struct {
			Actor string `json:"actor"`
		}
		if json.Unmarshal(out[i].Target, &t) == nil {
			out[i].Actor = t.Actor
		}
	}
	return out, nil
}

const recordColumns = `seq, at, os_user, db_role, host, coalesce(node_id, ''), action, target, outcome, prev_hash, hash`

func scanRecord(r pgx.CollectableRow) (Record, error) {
	var rec Record
	var target string
	err := r.Scan(&rec.Seq, &rec.At, &rec.OSUser, &rec.DBRole, &rec.Host, &rec.Node, &rec.Action,
		&target, &rec.Outcome, &rec.PrevHash, &rec.Hash)
	rec.Target = []byte(target)
	return rec, err
}

// Anchor is the head of the chain at some moment: how many rows it had and
// the last one's hash. Written "seq:hash"; the empty log is "0:".
type Anchor struct {
	Seq  int64  `json:"seq"`
	Hash string `json:"hash"`
}

func (a Anchor) String() string { return strconv.FormatInt(a.Seq, 10) + ":" + a.Hash }

var hashRE = regexp.MustCompile(`^[0-9a-f]{64}$`)

// ParseAnchor reads an anchor as `mefor audit anchor` prints it.
func ParseAnchor(s string) (Anchor, error) {
	n, h, ok := strings.Cut(strings.TrimSpace(s), ":")
	seq, err := strconv.ParseInt(n, 10, 64)
	if !ok || err != nil || seq < 0 || (seq == 0) != (h == "") || (h != "" && !hashRE.MatchString(h)) {
		return Anchor{}, fmt.Errorf("anchor %q is not SEQ:HASH as 'mefor audit anchor' prints it (e.g. 42:3f9a…, 64 hex digits)", s)
	}
	return Anchor{Seq: seq, Hash: h}, nil
}

// Head returns the chain's current anchor.
func Head(ctx context.Context, q DBTX) (Anchor, error) {
	var a Anchor
	err := q.QueryRow(ctx, `SELECT seq, hash FROM mefor_audit ORDER BY seq DESC LIMIT 1`).Scan(&a.Seq, &a.Hash)
	if errors.Is(err, pgx.ErrNoRows) {
		return Anchor{}, nil
	}
	if err != nil {
		return Anchor{}, fmt.Errorf("read the audit log's head: %w", err)
	}
	return a, nil
}

// Verification is what Verify found.
type Verification struct {
	// Rows is how many rows were checked.
	Rows int64 `json:"rows"`
	// Head is the last row's anchor.
	Head Anchor `json:"head"`
	// BadSeq is the first row that does not verify (0: none); for a cut
	// tail, the anchor's row that is gone.
	BadSeq int64 `json:"bad_seq,omitempty"`
	// Problem says what is wrong at BadSeq.
	Problem string `json:"problem,omitempty"`
	// Anchors is how many stored anchors were checked against the chain;
	// AnchorsSigned how many of them had their signature checked with the
	// audit key (none without one).
	Anchors       int `json:"anchors"`
	AnchorsSigned int `json:"anchors_signed"`
	// LatestAnchor is the newest stored anchor checked; rows after its
	// seq are protected by the unkeyed chain alone until the next one.
	LatestAnchor *StoredAnchor `json:"latest_anchor,omitempty"`
	// Keyed says the check used the audit key.
	Keyed bool `json:"keyed"`
	// Setup lists what is wrong with who may write the log (see
	// CheckSetup); any entry fails the verification.
	Setup []string `json:"setup_problems,omitempty"`
	// SetupNote says why the setup was not checked.
	SetupNote string `json:"setup_note,omitempty"`
}

// OK reports whether the whole chain, its anchors and the log's setup
// verified.
func (v Verification) OK() bool { return v.Problem == "" && len(v.Setup) == 0 }

// verifyPage is how many rows Verify reads per query.
const verifyPage = 5000

// VerifyOptions says what Verify checks besides the chain.
type VerifyOptions struct {
	// Anchor is an anchor kept outside the database (`mefor audit
	// anchor`), checked like a stored one.
	Anchor *Anchor
	// Keys checks the stored anchors' signatures; nil checks only that
	// their rows are still there, unchanged.
	Keys *Keys
}

// Verify recomputes the chain from the first row to the last and reports
// the first row that was altered, or that follows deleted rows. With an
// anchor, it also checks that the anchor's row is still there with the
// anchor's hash: rows cut off the end, or a chain rebuilt from scratch,
// show there. It checks the stored anchors the same way (see VerifyWith).
func Verify(ctx context.Context, q DBTX, anchor *Anchor) (Verification, error) {
	return VerifyWith(ctx, q, VerifyOptions{Anchor: anchor})
}

// VerifyWith is Verify with the stored anchors' signatures checked under
// o.Keys, and the log's setup checked (CheckSetup).
func VerifyWith(ctx context.Context, q DBTX, o VerifyOptions) (Verification, error) {
	var v Verification
	v.Keyed = o.Keys != nil
	setup, note, err := CheckSetup(ctx, q)
	if err != nil {
		return v, err
	}
	v.Setup, v.SetupNote = setup, note
	var anchors []StoredAnchor
	var anchored bool // a schema older than migration 019 has no anchors
	if err := q.QueryRow(ctx, `SELECT to_regclass('mefor_audit_anchor') IS NOT NULL`).Scan(&anchored); err != nil {
		return v, fmt.Errorf("read audit anchors: %w", err)
	}
	if anchored {
		if anchors, err = AnchorsAfter(ctx, q, 0, 1<<30); err != nil {
			return v, err
		}
	}
	hashAt := make(map[int64]string, len(anchors))
	for _, a := range anchors {
		hashAt[a.Seq] = ""
	}
	anchor := o.Anchor
	prev := Record{}
	var anchorHash string
	anchorSeen := false
	for {
		page, err := dbpool.Rows(ctx, q, "read the audit log", scanRecord, `SELECT `+recordColumns+` FROM mefor_audit WHERE seq > $1 ORDER BY seq LIMIT $2`,
			prev.Seq, verifyPage)
		if err != nil {
			return v, err
		}
		for _, r := range page {
			if problem := check(prev, r); problem != "" {
				v.BadSeq, v.Problem = r.Seq, problem
				return v, nil
			}
			v.Rows++
			v.Head = Anchor{Seq: r.Seq, Hash: r.Hash}
			if anchor != nil && r.Seq == anchor.Seq {
				anchorSeen, anchorHash = true, r.Hash
			}
			if _, ok := hashAt[r.Seq]; ok {
				hashAt[r.Seq] = r.Hash
			}
			prev = r
		}
		if len(page) < verifyPage {
			break
		}
	}
	for seq, h := range hashAt {
		if h == "" {
			delete(hashAt, seq)
		}
	}
	if checkAnchors(anchors, hashAt, v.Head, o.Keys, &v); v.Problem != "" {
		return v, nil
	}
	if anchor == nil || anchor.Seq == 0 {
		return v, nil
	}
	switch {
	case !anchorSeen:
		v.BadSeq = anchor.Seq
		v.Problem = fmt.Sprintf("the log ends at row %d, but the anchor says row %d existed: rows %d to %d were deleted",
			v.Head.Seq, anchor.Seq, v.Head.Seq+1, anchor.Seq)
	case anchorHash != anchor.Hash:
		v.BadSeq = anchor.Seq
		v.Problem = fmt.Sprintf("row %d's hash is not the anchor's: the log up to it was rewritten", anchor.Seq)
	}
	return v, nil
}

// check says what is wrong with r, read after prev (the zero Record before
// the first row).
func check(prev, r Record) string {
	switch {
	case r.Seq != prev.Seq+1 && prev.Seq == 0:
		return fmt.Sprintf("the log starts at row %d: rows 1 to %d were deleted", r.Seq, r.Seq-1)
	case r.Seq != prev.Seq+1:
		return fmt.Sprintf("row %d follows row %d: rows %d to %d were deleted", r.Seq, prev.Seq, prev.Seq+1, r.Seq-1)
	case r.PrevHash != prev.Hash:
		return fmt.Sprintf("row %d does not chain to row %d: one of the two was altered", r.Seq, prev.Seq)
	case rowHash(r) != r.Hash:
		return fmt.Sprintf("row %d was altered: its contents do not match its hash", r.Seq)
	}
	return ""
}

// RowsAfter returns up to limit rows numbered after seq, oldest first:
// what a forwarder that has sent the log up to seq sends next. Limit
// defaults to 500 when not positive.
func RowsAfter(ctx context.Context, q DBTX, seq int64, limit int) ([]Record, error) {
	if limit <= 0 {
		limit = 500
	}
	rows, err := q.Query(ctx, `SELECT `+recordColumns+` FROM mefor_audit WHERE seq > $1 ORDER BY seq LIMIT $2`, seq, limit)
	if err != nil {
		return nil, fmt.Errorf("read the audit log after row %d: %w", seq, err)
	}
	out, err := pgx.CollectRows(rows, scanRecord)
	if err != nil {
		return nil, fmt.Errorf("read the audit log after row %d: %w", seq, err)
	}
	return out, nil
}
