package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"

	"github.com/jackc/pgx/v5/pgxpool"
)

// writeJSON is what every read command prints under --json: indented, one
// document, so it pipes into jq.
func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// query opens the database, runs one read on it and closes it again: the
// shape of every command that reads and prints.
func query[T any](ctx context.Context, g *Globals, read func(context.Context, *pgxpool.Pool) (T, error)) (T, error) {
	pool, err := g.pool(ctx)
	if err != nil {
		var zero T
		return zero, err
	}
	defer pool.Close()
	return read(ctx, pool)
}

// listing says how a list command prints its rows as a table.
type listing[T any] struct {
	// Empty is the sentence printed instead of a table when there are no
	// rows; it says why there may be none.
	Empty string
	// Header is the table's tab-separated column names.
	Header string
	// Row writes one row, tab-separated and ending in a newline.
	Row func(w io.Writer, row T)
}

// printList prints rows as JSON (an empty array rather than null, so jq
// filters work on it) or as the listing's table.
func printList[T any](w io.Writer, asJSON bool, rows []T, l listing[T]) error {
	if asJSON {
		if rows == nil {
			rows = []T{}
		}
		return writeJSON(w, rows)
	}
	if len(rows) == 0 && l.Empty != "" {
		_, err := fmt.Fprintln(w, l.Empty)
		return err
	}
	tw := newTable(w)
	fmt.Fprintln(tw, l.Header)
	for _, r := range rows {
		l.Row(tw, r)
	}
	return tw.Flush()
}
