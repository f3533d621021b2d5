// Package dbpool builds mefor's PostgreSQL connection pools: one for a
// command (the CLI, and later the API) and one for a node. Whatever opens a
// pool goes through here, so the settings durability rests on
// (DurableCommits) cannot be left out of one of them. DBTX is what the
// statements of the packages that own tables run on.
package dbpool

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// DefaultMaxConns is a command's pool size unless the URL sets
// pool_max_conns. Defaults to 20: pgx's own default (4 on a 2-core host)
// starves a node whose stage drainers each hold a connection per hand-off;
// connections are opened on demand, so a CLI command still uses one or two.
const DefaultMaxConns = 20

// ErrInvalidURL is returned for a database URL pgx cannot parse. It never
// carries the URL: pgx's parse errors can echo it, password included.
var ErrInvalidURL = errors.New("database URL is not valid: want postgres://user:password@host:port/dbname")

// DurableCommits makes the sessions of a connection configuration wait for
// their commits to be flushed: synchronous_commit "on", unless the
// configuration already names a value (a synchronous_commit=... parameter
// of the database URL, e.g. remote_apply). A server or database whose
// default is "off" would otherwise let a commit return, and the sender be
// acknowledged, before the message is on disk, and a database crash would
// then lose acknowledged messages.
func DurableCommits(cfg *pgconn.Config) {
	if cfg.RuntimeParams == nil {
		cfg.RuntimeParams = map[string]string{}
	}
	if _, set := cfg.RuntimeParams["synchronous_commit"]; !set {
		cfg.RuntimeParams["synchronous_commit"] = "on"
	}
}

// CommandConfig parses a database URL into the configuration of a
// command's pool: DefaultMaxConns unless the URL sets pool_max_conns,
// DurableCommits, since every command that stores or changes messages
// (enqueue, replay, cancel, run) must not be answered before its commit is
// on disk, and the CommandSession timeouts with CommandIdleInTransaction,
// unless the URL sets them. A URL that does not parse is ErrInvalidURL.
func CommandConfig(url string) (*pgxpool.Config, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, ErrInvalidURL
	}
	if !strings.Contains(url, "pool_max_conns") {
		cfg.MaxConns = DefaultMaxConns
	}
	DurableCommits(&cfg.ConnConfig.Config)
	commandSessions(&cfg.ConnConfig.Config)
	return cfg, nil
}

// Open opens a pool and checks that the database answers, so a bad URL
// fails here with the host named rather than on a later query.
func Open(ctx context.Context, cfg *pgxpool.Config) (*pgxpool.Pool, error) {
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("connect to database at %s:%d: %w", cfg.ConnConfig.Host, cfg.ConnConfig.Port, err)
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("connect to database at %s:%d: %w", cfg.ConnConfig.Host, cfg.ConnConfig.Port, err)
	}
	return pool, nil
}

// NodeOptions are what NodeConfig adds to a base configuration.
type NodeOptions struct {
	// ApplicationName names the node's sessions, so the other nodes can end
	// them once it is dead (leader.ApplicationName gives it).
	ApplicationName string
	// LeaseTTL bounds a transaction left idle: see NodeConfig.
	LeaseTTL time.Duration
	// Warm, when set, readies every new session before its first use. It
	// is best effort: its error is logged at debug and the session used
	// anyway.
	Warm func(ctx context.Context, conn *pgx.Conn) error
	// Logger receives Warm's failures. Defaults to discarding them.
	Logger *slog.Logger
}

// NodeConfig is base with the session settings a node's connections need,
// whoever runs the node:
//   - application_name (opts.ApplicationName);
//   - the NodeSession timeouts, unless the URL set them;
//   - idle_in_transaction_session_timeout (opts.LeaseTTL, unless the URL
//     sets it): a node frozen or cut off in the middle of a transaction keeps
//     its session, and with it its lane locks and River row locks, until
//     TCP gives up (hours), and the node taking over would wait on them.
//     Nothing a node does sits idle inside a transaction, so the server may
//     end such a session once the lease could have moved;
//   - DurableCommits;
//   - every new session is readied (opts.Warm) before its first use.
//
// base is not changed.
func NodeConfig(base *pgxpool.Config, opts NodeOptions) *pgxpool.Config {
	logger := opts.Logger
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	cfg := base.Copy()
	params := cfg.ConnConfig.RuntimeParams
	if params == nil {
		params = map[string]string{}
		cfg.ConnConfig.RuntimeParams = params
	}
	params["application_name"] = opts.ApplicationName
	// base is usually a command's configuration (CommandConfig): its
	// values are the command's, which the node's replace.
	NodeSession.sessionParams(params, &CommandSession)
	if v, set := params["idle_in_transaction_session_timeout"]; !set || v == ms(CommandIdleInTransaction) {
		params["idle_in_transaction_session_timeout"] = strconv.FormatInt(opts.LeaseTTL.Milliseconds(), 10)
	}
	DurableCommits(&cfg.ConnConfig.Config)
	after, warm := cfg.AfterConnect, opts.Warm
	cfg.AfterConnect = func(ctx context.Context, c *pgx.Conn) error {
		if after != nil {
			if err := after(ctx, c); err != nil {
				return err
			}
		}
		if warm != nil {
			if err := warm(ctx, c); err != nil {
				logger.DebugContext(ctx, "a new database session was not readied; its first statements will be slower", "error", err)
			}
		}
		return nil
	}
	return cfg
}
