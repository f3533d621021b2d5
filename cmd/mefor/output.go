package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/mefor/mefor/ops"
	"github.com/riverqueue/river"
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

// queued is query for the commands that queue work: it hands run an
// insert-only River client on the same pool.
func queued[T any](ctx context.Context, g *Globals, run func(context.Context, *pgxpool.Pool, *river.Client[pgx.Tx]) (T, error)) (T, error) {
	return query(ctx, g, func(ctx context.Context, pool *pgxpool.Pool) (T, error) {
		q, err := ops.NewQueue(pool, g.logger)
		if err != nil {
			var zero T
			return zero, err
		}
		return run(ctx, pool, q)
	})
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

// queryList is query for the list commands: it reads the rows and prints
// them with printList.
func queryList[T any](ctx context.Context, g *Globals, asJSON bool, read func(context.Context, *pgxpool.Pool) ([]T, error), l listing[T]) error {
	rows, err := query(ctx, g, read)
	if err != nil {
		return err
	}
	return printList(g.stdout, asJSON, rows, l)
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

// printSection prints one titled part of a show command: an indented table
// (with a header row unless header is empty), or "none".
func printSection[T any](w io.Writer, title string, rows []T, header string, row func(w io.Writer, row T)) error {
	fmt.Fprintf(w, "\n%s:\n", title)
	if len(rows) == 0 {
		_, err := fmt.Fprintln(w, "  none")
		return err
	}
	tw := newTable(w)
	if header != "" {
		fmt.Fprintln(tw, "  "+header)
	}
	for _, r := range rows {
		fmt.Fprint(tw, "  ")
		row(tw, r)
	}
	return tw.Flush()
}
