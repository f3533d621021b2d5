package ops

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/mefor/mefor/internal/audit"
	"github.com/mefor/mefor/internal/config"
	"github.com/mefor/mefor/internal/crypt"
	"github.com/mefor/mefor/internal/reference"
)

// ReferenceSetView is one reference set of a config with the state of its
// snapshot in the database.
type ReferenceSetView struct {
	reference.ReferenceSetInfo
	// Refresh is the set's schedule as written in the config.
	Refresh string `json:"refresh"`
	// Configured is the source as the config declares it now; Source (from
	// the snapshot) is what the live snapshot was read from.
	Configured string `json:"configured_source"`
}

// ErrUnknownSet is returned for a name that is not a reference set of the
// config.
var ErrUnknownSet = errors.New("unknown reference set")

// ListReferenceSets returns every reference set of cfg, in file order, with
// its live version, row count, last sync and last failure.
func ListReferenceSets(ctx context.Context, pool *pgxpool.Pool, cfg *config.Config) ([]ReferenceSetView, error) {
	names := make([]string, len(cfg.ReferenceSets))
	for i, s := range cfg.ReferenceSets {
		names[i] = s.Name
	}
	infos, err := reference.ReferenceSets(ctx, pool, names)
	if err != nil {
		return nil, err
	}
	out := make([]ReferenceSetView, len(infos))
	for i, info := range infos {
		set := &cfg.ReferenceSets[i]
		out[i] = ReferenceSetView{ReferenceSetInfo: info, Refresh: set.Refresh.String(), Configured: set.Source.String()}
	}
	return out, nil
}

// ReferenceSetDetail is a set with rows of its live snapshot.
type ReferenceSetDetail struct {
	ReferenceSetView
	Rows []reference.ReferenceRow `json:"rows"`
	// More says rows were left out past the limit.
	More bool `json:"more"`
}

// ShowReferenceSet returns set name of cfg and up to limit rows of its live
// snapshot in key order, or only the row of key when key is not empty.
func ShowReferenceSet(ctx context.Context, pool *pgxpool.Pool, kr *crypt.Keyring, cfg *config.Config, name, key string, limit int) (*ReferenceSetDetail, error) {
	if err := knownSet(cfg, name); err != nil {
		return nil, err
	}
	infos, err := reference.ReferenceSets(ctx, pool, []string{name})
	if err != nil {
		return nil, err
	}
	set := cfg.ReferenceSet(name)
	d := &ReferenceSetDetail{ReferenceSetView: ReferenceSetView{
		ReferenceSetInfo: infos[0], Refresh: set.Refresh.String(), Configured: set.Source.String(),
	}, Rows: []reference.ReferenceRow{}}
	if d.Version == 0 {
		return d, nil
	}
	// The values are content: the read and its audit row share one
	// transaction. The row names the set and whether one key was asked
	// for, never the key (it can be an identifier).
	// The rows come through mefor_read_reference, which appends the
	// view-reference row itself: an operator cannot read the values
	// otherwise. The pointer's columns are read in the same snapshot.
	target := map[string]any{"set": name, "by_key": key != ""}
	err = audited(ctx, pool, pgx.TxOptions{IsoLevel: pgx.RepeatableRead}, audit.ActionViewReference, target,
		func(tx pgx.Tx) (string, error) {
			infos, err := reference.ReferenceSets(ctx, tx, []string{name})
			if err != nil {
				return "", err
			}
			osUser, host := audit.Who()
			version, rows, more, err := reference.ReadReferenceRows(ctx, tx, kr, name, infos[0].Columns, key, limit, osUser, host)
			if err != nil {
				return "", err
			}
			if version != 0 {
				d.Version, d.Columns = version, infos[0].Columns
			}
			if rows != nil {
				d.Rows = rows
			}
			d.More = more
			return noAudit, nil
		})
	if err != nil {
		return nil, err
	}
	return d, nil
}

// SyncReferenceSet enqueues a sync of set name now, for any node to work,
// and with wait > 0 waits for its outcome, as `mefor maintenance run
// reference-sync:NAME` does.
func SyncReferenceSet(ctx context.Context, pool *pgxpool.Pool, q MaintenanceQueue, cfg *config.Config, name string, wait time.Duration) (MaintenanceRunResult, error) {
	if err := knownSet(cfg, name); err != nil {
		return MaintenanceRunResult{Job: reference.JobName(name)}, err
	}
	return RunMaintenance(ctx, pool, q, cfg, reference.JobName(name), wait)
}

func knownSet(cfg *config.Config, name string) error {
	if cfg.ReferenceSet(name) != nil {
		return nil
	}
	var names []string
	for _, s := range cfg.ReferenceSets {
		names = append(names, s.Name)
	}
	if len(names) == 0 {
		return fmt.Errorf("%w %q: the config declares no reference_sets", ErrUnknownSet, name)
	}
	return fmt.Errorf("%w %q (sets of this config: %s)", ErrUnknownSet, name, strings.Join(names, ", "))
}
