package reference

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/mefor/mefor/internal/config"
	"github.com/mefor/mefor/internal/crypt"
	"github.com/mefor/mefor/internal/maintenance"
)

// JobName is the maintenance job name of set's sync, as audited in
// mefor_maintenance_run and listed by `mefor maintenance list`.
func JobName(set string) string { return "reference-sync:" + set }

// SyncResult is what a successful sync stored.
type SyncResult struct {
	Version int64
	Rows    int
}

// Syncer materializes reference sets from their sources.
type Syncer struct {
	Pool   *pgxpool.Pool
	NodeID string
	// Egress says how a set's source is reached (see EgressOf); nil
	// reaches it anywhere, with EgressOf's safe client and no TLS block.
	// Each source's timeout bounds its read.
	Egress func(set *config.ReferenceSet) Egress
	// Now is the clock of the audit; nil means time.Now.
	Now func() time.Time
	// Keys seals the rows' values; nil stores them in clear.
	Keys *crypt.Keyring
}

func (s *Syncer) now() time.Time {
	if s.Now != nil {
		return s.Now()
	}
	return time.Now()
}

// Sync reads set's source and, if that succeeds, makes its rows the set's
// new snapshot: rows, pointer and audit row commit in one transaction. If
// reading or writing fails, the last good snapshot stays live, the failure
// is noted on the set and audited, and the error is returned. Errors name
// the source and where it failed, never row contents.
func (s *Syncer) Sync(ctx context.Context, set *config.ReferenceSet) (SyncResult, error) {
	started := s.now()
	e := EgressOf(nil, nil, set)
	if s.Egress != nil {
		e = s.Egress(set)
	}
	snap, err := Read(ctx, set, e)
	if err != nil {
		return SyncResult{}, s.fail(ctx, set, started, err)
	}
	var res SyncResult
	err = pgx.BeginFunc(ctx, s.Pool, func(tx pgx.Tx) error {
		version, err := WriteReferenceSnapshot(ctx, tx, s.Keys, set.Name, snap)
		if err != nil {
			return err
		}
		res = SyncResult{Version: version, Rows: len(snap.Rows)}
		return maintenance.RecordRun(ctx, tx, maintenance.MaintenanceRun{
			Job: JobName(set.Name), NodeID: s.NodeID, StartedAt: started, FinishedAt: s.now(),
			Outcome: maintenance.RunOK,
			Detail:  map[string]any{"version": version, "rows": len(snap.Rows), "columns": snap.Columns, "source": snap.Source},
		})
	})
	if err != nil {
		return SyncResult{}, s.fail(ctx, set, started, err)
	}
	return res, nil
}

// fail records a failed sync on the set and in the audit, and returns the
// error to report.
func (s *Syncer) fail(ctx context.Context, set *config.ReferenceSet, started time.Time, cause error) error {
	err := fmt.Errorf("sync reference set %s: %w", set.Name, cause)
	// The context may be what failed (a timeout); the record must still be
	// written so operators see why the snapshot did not move.
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	if rerr := RecordReferenceFailure(rctx, s.Pool, set.Name, cause.Error()); rerr != nil {
		return fmt.Errorf("%w (and recording the failure failed: %v)", err, rerr)
	}
	if rerr := maintenance.RecordRun(rctx, s.Pool, maintenance.MaintenanceRun{
		Job: JobName(set.Name), NodeID: s.NodeID, StartedAt: started, FinishedAt: s.now(),
		Outcome: maintenance.RunFailed, Error: cause.Error(),
		Detail: map[string]any{"source": set.Source.String()},
	}); rerr != nil {
		return fmt.Errorf("%w (and auditing the failure failed: %v)", err, rerr)
	}
	return err
}
