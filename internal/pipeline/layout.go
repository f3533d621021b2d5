package pipeline

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"slices"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Ordering changes. A destination's lanes are laid out by its ordering
// (fifo; parallel over N lanes; partitioned over N lanes by a key). When an
// operator changes the ordering, messages already queued sit in lanes laid
// out the old way, and new ones would go to lanes laid out the new way: a
// patient's new message could be delivered before an older one still
// queued. So each layout a destination has been delivered under gets a
// generation number, kept in mefor_destination_layout, the first one 0;
// lanes of generation g > 0 carry it in their name (jobs.OutboundLane), and
// a lane may deliver a row only while no lane of another generation of the
// same destination has a pending row with a lower seq (the barrier that
// PendingRows reads). The destination's lowest pending row is never held,
// so the old lanes drain and the new ones follow; during a rolling reload,
// when two nodes briefly produce both layouts, the lanes take turns by seq.
// While a destination has never changed, the barrier costs a scan of the
// small lane table per batch read of a delivery lane and no write at all.

// legacyLayout stands for rows queued before layouts were recorded: their
// ordering is unknown, so they are treated as another layout.
const legacyLayout = "(queued before lane layouts were recorded)"

// layoutLockClass keys the advisory lock that serializes numbering one
// destination's layouts.
const layoutLockClass int32 = 0x6d6c // "ml"

// ResolveLayouts returns the generation of each destination's layout
// (destination → config.Ordering.Layout()), numbering the layouts not seen
// before. A node calls it before it produces rows under a config: at start
// and at each reload.
func ResolveLayouts(ctx context.Context, pool *pgxpool.Pool, layouts map[string]string) (map[string]int, error) {
	gens := make(map[string]int, len(layouts))
	dests := make([]string, 0, len(layouts))
	for d := range layouts {
		dests = append(dests, d)
	}
	slices.Sort(dests)
	for _, d := range dests {
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			g, err := resolveLayout(ctx, tx, d, layouts[d])
			gens[d] = g
			return err
		})
		if err != nil {
			return nil, fmt.Errorf("number the lane layout of destination %s: %w", d, err)
		}
	}
	return gens, nil
}

func resolveLayout(ctx context.Context, tx pgx.Tx, dest, layout string) (int, error) {
	var gen int
	read := func() error {
		return tx.QueryRow(ctx, `SELECT generation FROM mefor_destination_layout WHERE destination = $1 AND layout = $2`,
			dest, layout).Scan(&gen)
	}
	if err := read(); !errors.Is(err, pgx.ErrNoRows) {
		return gen, err
	}
	h := fnv.New32a()
	h.Write([]byte(dest))
	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1, $2)`, layoutLockClass, int32(h.Sum32())); err != nil {
		return 0, err
	}
	if err := read(); !errors.Is(err, pgx.ErrNoRows) {
		return gen, err // another node numbered it meanwhile
	}
	// The destination's first recorded layout: rows already queued for it
	// were laid out by an ordering nobody recorded, so they get generation
	// 0 of their own and this layout the next one.
	_, err := tx.Exec(ctx, `
		INSERT INTO mefor_destination_layout (destination, layout, generation)
		SELECT $1, $2, 0
		WHERE NOT EXISTS (SELECT 1 FROM mefor_destination_layout WHERE destination = $1)
		  AND EXISTS (SELECT 1 FROM mefor_work WHERE stage = 'outbound' AND destination = $1 AND status = 'pending')`,
		dest, legacyLayout)
	if err != nil {
		return 0, err
	}
	err = tx.QueryRow(ctx, `
		INSERT INTO mefor_destination_layout (destination, layout, generation)
		SELECT $1, $2, coalesce(max(generation) + 1, 0) FROM mefor_destination_layout WHERE destination = $1
		RETURNING generation`, dest, layout).Scan(&gen)
	return gen, err
}
