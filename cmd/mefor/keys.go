package main

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/mefor/mefor/ops"
)

type keysCmd struct {
	Status keysStatusCmd `cmd:"" help:"Count the encrypted values under each key id, and the plaintext ones."`
	Rotate keysRotateCmd `cmd:"" help:"Re-encrypt every value not under the active key, plaintext included, in short batches while nodes run."`
}

func (c *keysCmd) Help() string {
	return `Message content at rest (bodies, stage payloads, partner replies, errors and
event details, transform state values, reference set values) is encrypted with
AES-256-GCM under the keys in MEFOR_ENCRYPTION_KEYS: comma-separated id=key
pairs, each key 32 random bytes in base64, the first pair the active key. Every
node and every command that reads or writes content needs the same variable.
Without it mefor stores content in plaintext, and 'mefor status' says so.

Make a key:
  head -c 32 /dev/urandom | base64

Rotate to a new key:
  1. put the new key first on every node and restart them one by one:
       MEFOR_ENCRYPTION_KEYS='k2=<new key>,k1=<old key>'
  2. re-encrypt what is under the old key (nodes keep running):
       MEFOR_ENCRYPTION_KEYS='k2=<new key>,k1=<old key>' mefor keys rotate
  3. check that k1 seals nothing any more, then drop it everywhere:
       mefor keys status

Encrypting a database that ran without keys is the same: set the variable on
every node, restart them, then run 'mefor keys rotate'.`
}

type keysStatusCmd struct {
	JSON bool `name:"json" help:"Print JSON instead of a table."`
}

func (c *keysStatusCmd) Help() string {
	return `Counts, for every encrypted column, the values under each key id and the ones
in plaintext (written before encryption was turned on), then says how many a
rotation would re-encrypt and which keys of MEFOR_ENCRYPTION_KEYS seal nothing
and can be dropped. It reads every row that holds content: expect a table scan.

Examples:
  mefor keys status
  mefor keys status --json | jq .by_key`
}

func (c *keysStatusCmd) Run(ctx context.Context, g *Globals) error {
	kr, err := g.keyring()
	if err != nil {
		return err
	}
	st, err := query(ctx, g, func(ctx context.Context, pool *pgxpool.Pool) (*ops.KeyStatus, error) {
		return ops.KeysStatus(ctx, pool, kr)
	})
	if err != nil {
		return err
	}
	if c.JSON {
		return writeJSON(g.stdout, st)
	}
	tw := newTable(g.stdout)
	fmt.Fprintln(tw, "COLUMN\tKEY\tVALUES")
	for _, k := range st.Counts {
		fmt.Fprintf(tw, "%s\t%s\t%d\n", k.Column, keyName(k.KeyID), k.Values)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	var parts []string
	for id, n := range st.ByKey {
		parts = append(parts, fmt.Sprintf("%s: %d", keyName(id), n))
	}
	fmt.Fprintf(g.stdout, "\nvalues by key: %s\n", orDash(strings.Join(slices.Sorted(slices.Values(parts)), ", ")))
	switch {
	case st.Active == "":
		fmt.Fprintln(g.stdout, "MEFOR_ENCRYPTION_KEYS is not set for this command: new content is stored in plaintext where it is not set either")
	case st.Pending > 0:
		fmt.Fprintf(g.stdout, "%d values are not under the active key %s: run 'mefor keys rotate'\n", st.Pending, st.Active)
	default:
		fmt.Fprintf(g.stdout, "every value is under the active key %s\n", st.Active)
	}
	if st.SealedStore {
		fmt.Fprintln(g.stdout, "sealed store: content that is plaintext or not bound to its row is refused as tampered")
	} else if st.Active != "" {
		fmt.Fprintf(g.stdout, "plaintext accepted until `mefor keys rotate` completes (%d content values not sealed to their row)\n", st.Unbound)
	}
	for _, id := range st.Droppable {
		fmt.Fprintf(g.stdout, "key %s seals nothing: it can be dropped from MEFOR_ENCRYPTION_KEYS\n", id)
	}
	for _, id := range st.Unknown {
		fmt.Fprintf(g.stdout, "warning: values are sealed under key %s, which MEFOR_ENCRYPTION_KEYS does not hold: they cannot be read\n", id)
	}
	return nil
}

type keysRotateCmd struct {
	BatchSize int  `default:"500" help:"Values re-encrypted per transaction."`
	JSON      bool `name:"json" help:"Print the result as JSON (no progress bar)."`
}

func (c *keysRotateCmd) Help() string {
	return `Re-encrypts, under the active key (the first of MEFOR_ENCRYPTION_KEYS), every
value that is not under it: values under older keys, and plaintext written
before encryption was turned on. It works column by column in short
transactions while nodes keep running, with a progress bar on a terminal;
rows a node is writing at that moment are skipped and counted as left. An
interrupted run keeps what it did: run it again to finish. A batch with a
value no key of MEFOR_ENCRYPTION_KEYS opens fails before writing anything and
names the key it needs. Each batch is recorded in the audit log.

It needs the mefor_admin role.

Examples:
  MEFOR_ENCRYPTION_KEYS='k2=<new key>,k1=<old key>' mefor keys rotate
  mefor keys rotate --batch-size 200 --json`
}

func (c *keysRotateCmd) needsRole() string { return ops.RequiredRole(ops.OpKeysRotate) }

func (c *keysRotateCmd) Run(ctx context.Context, g *Globals) error {
	kr, err := g.keyring()
	if err != nil {
		return err
	}
	if !kr.Enabled() {
		return fmt.Errorf("MEFOR_ENCRYPTION_KEYS is not set: there is no key to encrypt under (see 'mefor keys --help')")
	}
	pool, err := g.pool(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	bar := newBar(g, c.JSON, "re-encrypting")
	res, err := ops.RotateKeys(ctx, pool, kr, ops.RotateOptions{BatchSize: c.BatchSize, Progress: bar.progress})
	bar.finish()
	if err != nil {
		done := 0
		for _, n := range res.Resealed {
			done += n
		}
		if done > 0 {
			return fmt.Errorf("stopped after re-encrypting %d of %d values (run it again to go on): %w", done, res.Total, err)
		}
		return err
	}
	if c.JSON {
		return writeJSON(g.stdout, res)
	}
	total := 0
	for _, n := range res.Resealed {
		total += n
	}
	fmt.Fprintf(g.stdout, "re-encrypted %d values under key %s", total, kr.ActiveID())
	var from []string
	for id, n := range res.From {
		from = append(from, fmt.Sprintf("%s: %d", keyName(id), n))
	}
	if len(from) > 0 {
		fmt.Fprintf(g.stdout, " (from %s)", strings.Join(slices.Sorted(slices.Values(from)), ", "))
	}
	fmt.Fprintln(g.stdout)
	if res.Kept > 0 {
		fmt.Fprintf(g.stdout, "%d patient index entries stay under an older key: retention purged the bodies they come from; "+
			"once that key is dropped, --patient no longer finds those messages\n", res.Kept)
	}
	if left := res.Left - int64(res.Kept); left > 0 {
		fmt.Fprintf(g.stdout, "%d values were being written by nodes and were left: run 'mefor keys rotate' again\n", left)
	}
	if res.SealedStore {
		fmt.Fprintln(g.stdout, "every content value is sealed to its row: nodes now refuse plaintext and values not bound to their row as tampered")
	} else {
		fmt.Fprintf(g.stdout, "plaintext accepted until `mefor keys rotate` completes: %d content values are not sealed to their row yet; run it again\n", res.Unbound)
	}
	return nil
}

func keyName(id string) string {
	if id == "" {
		return "plaintext"
	}
	return id
}
