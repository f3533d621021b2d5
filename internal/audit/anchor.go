package audit

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/mefor/mefor/internal/dbpool"
)

// StoredAnchor is an anchor the audit_anchor job (or TakeAnchor) recorded
// in mefor_audit_anchor: the chain's head when it was taken, signed with
// the audit key when the taker had one.
type StoredAnchor struct {
	// No numbers anchors 1, 2, 3, ...
	No      int64     `json:"no"`
	Seq     int64     `json:"audit_seq"`
	Hash    string    `json:"audit_hash"`
	TakenAt time.Time `json:"taken_at"`
	Node    string    `json:"node,omitempty"`
	// KeyID and MAC are empty for an anchor taken without a key.
	KeyID   string `json:"key_id,omitempty"`
	PrevMAC string `json:"prev_mac"`
	MAC     string `json:"mac,omitempty"`
}

// TakeAnchor records the chain's current head as the next anchor, signed
// under keys' active key (unsigned without keys). It does nothing and
// reports false when the latest anchor already covers the head, or the log
// is empty. Another taker anchoring at the same moment makes it fail; the
// next run takes it.
func TakeAnchor(ctx context.Context, db Beginner, keys *Keys, node string) (StoredAnchor, bool, error) {
	var out StoredAnchor
	took := false
	err := pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		head, err := Head(ctx, tx)
		if err != nil || head.Seq == 0 {
			return err
		}
		last, err := latestAnchor(ctx, tx)
		if err != nil {
			return err
		}
		if last.Seq == head.Seq && last.Hash == head.Hash && (keys == nil || last.MAC != "") {
			return nil
		}
		a := StoredAnchor{No: last.No + 1, Seq: head.Seq, Hash: head.Hash, Node: node, PrevMAC: last.MAC}
		if keys != nil {
			a.KeyID = keys.ActiveID()
			a.MAC = keys.anchorMAC(a.KeyID, a.No, a.Seq, a.Hash, a.PrevMAC)
		}
		_, err = tx.Exec(ctx, `SELECT mefor_audit_anchor_add($1, $2, $3, $4, $5, $6, $7)`,
			a.No, a.Seq, a.Hash, a.Node, a.KeyID, a.PrevMAC, a.MAC)
		if err != nil {
			return fmt.Errorf("record audit anchor %d: %w", a.No, err)
		}
		out, took = a, true
		return nil
	})
	return out, took, err
}

func latestAnchor(ctx context.Context, q DBTX) (StoredAnchor, error) {
	rows, err := q.Query(ctx, `SELECT `+anchorColumns+` FROM mefor_audit_anchor ORDER BY no DESC LIMIT 1`)
	if err != nil {
		return StoredAnchor{}, fmt.Errorf("read the latest audit anchor: %w", err)
	}
	a, err := pgx.CollectOneRow(rows, scanAnchor)
	if errors.Is(err, pgx.ErrNoRows) {
		return StoredAnchor{}, nil
	}
	if err != nil {
		return StoredAnchor{}, fmt.Errorf("read the latest audit anchor: %w", err)
	}
	return a, nil
}

const anchorColumns = `no, audit_seq, audit_hash, taken_at, coalesce(node_id, ''), coalesce(key_id, ''), prev_mac, coalesce(mac, '')`

func scanAnchor(r pgx.CollectableRow) (StoredAnchor, error) {
	var a StoredAnchor
	err := r.Scan(&a.No, &a.Seq, &a.Hash, &a.TakenAt, &a.Node, &a.KeyID, &a.PrevMAC, &a.MAC)
	return a, err
}

// AnchorsAfter returns up to limit stored anchors numbered after no, oldest
// first: what a forwarder that has sent anchors up to no sends next.
func AnchorsAfter(ctx context.Context, q DBTX, no int64, limit int) ([]StoredAnchor, error) {
	if limit <= 0 {
		limit = 100
	}
	return dbpool.Rows(ctx, q, "read audit anchors", scanAnchor, `SELECT `+anchorColumns+` FROM mefor_audit_anchor WHERE no > $1 ORDER BY no LIMIT $2`, no, limit)
}

// checkAnchors checks the stored anchors against the verified chain, whose
// hashes at the anchored seqs are in hashAt and whose head is head. It
// fills v's anchor counts and, for the first problem, BadSeq and Problem.
func checkAnchors(anchors []StoredAnchor, hashAt map[int64]string, head Anchor, keys *Keys, v *Verification) {
	prevMAC := ""
	signedSeen := false
	for i, a := range anchors {
		bad := func(format string, args ...any) {
			v.BadSeq, v.Problem = a.Seq, fmt.Sprintf("anchor %d: ", a.No)+fmt.Sprintf(format, args...)
		}
		if a.No != int64(i)+1 {
			v.BadSeq, v.Problem = a.Seq, fmt.Sprintf("anchor %d follows anchor %d: anchors %d to %d were deleted",
				a.No, i, i+1, a.No-1)
			return
		}
		if keys != nil {
			switch {
			case a.MAC == "" && signedSeen:
				bad("it is not signed, though earlier anchors are: anchors were replaced")
				return
			case a.MAC == "":
			case !keys.Has(a.KeyID):
				bad("it is signed under audit key %q, which %s does not hold", a.KeyID, EnvKey)
				return
			case a.PrevMAC != prevMAC:
				bad("it does not chain to anchor %d: anchors were replaced", a.No-1)
				return
			case keys.anchorMAC(a.KeyID, a.No, a.Seq, a.Hash, a.PrevMAC) != a.MAC:
				bad("its signature does not match: the anchor, or the log up to row %d, was rewritten", a.Seq)
				return
			default:
				signedSeen = true
				v.AnchorsSigned++
			}
		}
		prevMAC = a.MAC
		h, ok := hashAt[a.Seq]
		switch {
		case !ok && a.Seq > head.Seq:
			bad("the log ends at row %d, but row %d existed when the anchor was taken: rows %d to %d were deleted",
				head.Seq, a.Seq, head.Seq+1, a.Seq)
			return
		case !ok || h != a.Hash:
			bad("row %d's hash is not the anchor's: the log up to it was rewritten", a.Seq)
			return
		}
		v.Anchors++
		v.LatestAnchor = &anchors[i]
	}
}
