// Package testcontainers gives integration tests a real PostgreSQL: one
// container per test binary (started on first use through testcontainers-go)
// and one fresh database per test, cloned from a template that already holds
// mefor's and River's schema. Tests never share a database, so they can run in
// parallel.
//
// The image comes from MEFOR_PG_IMAGE. When it is unset the harness uses the
// locally built mefor-postgres:15 (see pgimage/build.sh) if present, else the
// public postgres image.
//
// The server runs with fsync, synchronous_commit and full_page_writes off
// and its data on tmpfs: tests kill nodes, never the database. Its
// autovacuum wakes every second, so tables that a test fills from empty
// are analyzed as they grow. With MEFOR_PG_DURABLE=1 (task bench sets it)
// the server keeps PostgreSQL's defaults for all four, and the data
// directory is an anonymous Docker volume on real disk, so a commit costs
// its fsync. MEFOR_PG_STATEMENTS=1 preloads pg_stat_statements and times WAL
// writes and syncs (pg_stat_wal). MEFOR_PG_SETTINGS adds server settings
// for a diagnosis.
//
// testcontainers' reaper (Ryuk) cannot be pulled on
// machines without a registry, so it is disabled and the harness cleans up
// itself: containers carry labels naming the owning process, and every start
// removes containers whose owner is gone.
package testcontainers

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/api/types/mount"
	"github.com/sethvargo/go-retry"
	tc "github.com/testcontainers/testcontainers-go"
	tclog "github.com/testcontainers/testcontainers-go/log"
	"github.com/testcontainers/testcontainers-go/wait"

	"github.com/mefor/mefor/migrations"
)

const (
	// LocalImage is what pgimage/build.sh builds by default.
	LocalImage = "mefor-postgres:15"
	// PublicImage is used where a registry is reachable and no local image exists.
	PublicImage = "postgres:17"

	labelOwner   = "org.mefor.test"
	labelPID     = "org.mefor.test.pid"
	labelHost    = "org.mefor.test.host"
	labelStarted = "org.mefor.test.started"

	user     = "postgres"
	password = "mefor-test"

	templateDB = "mefor_template"

	dataDir = "/var/lib/postgresql/data"
)

// Server is one running PostgreSQL container.
type Server struct {
	container *tc.DockerContainer
	host      string
	port      string

	createMu sync.Mutex // CREATE DATABASE ... TEMPLATE refuses concurrent use of the template
	admin    *pgxpool.Pool
	counter  atomic.Int64
}

// The per-binary server. Package state is unavoidable here: tests of one
// binary share one container, and Main must be able to stop it.
var (
	mainActive  atomic.Bool
	serverOnce  sync.Once
	server      *Server
	serverErr   error
	serverMu    sync.Mutex
	extraOwners []*Server
	// exitHooks stop what tests shared across the binary (the browser)
	// when Main ends.
	exitHooks []func(context.Context)
)

// configure sets up testcontainers-go for machines without a registry. It
// must run before testcontainers-go reads its configuration, which it does
// once, on first use. It runs once: servers started by parallel tests
// (NewServer beside the shared one) would otherwise race on the
// environment and on testcontainers-go's logger.
func configure() { configureOnce.Do(configureTestcontainers) }

var configureOnce sync.Once

func configureTestcontainers() {
	// Ryuk's image cannot be pulled without a registry; our labels and sweep
	// do its job. testcontainers-go reads this once, before its first use.
	if os.Getenv("TESTCONTAINERS_RYUK_DISABLED") == "" {
		os.Setenv("TESTCONTAINERS_RYUK_DISABLED", "true")
	}
	// Inside a container (/.dockerenv) testcontainers-go assumes the engine
	// is reached through the default gateway. When the engine runs in this
	// very network namespace (its docker0 bridge is ours) the mapped ports are
	// on loopback, and the gateway is some other machine.
	if os.Getenv("TESTCONTAINERS_HOST_OVERRIDE") == "" && engineIsLocal() {
		os.Setenv("TESTCONTAINERS_HOST_OVERRIDE", "127.0.0.1")
	}
	// testcontainers-go narrates every step; failures are returned anyway.
	if os.Getenv("MEFOR_TC_VERBOSE") == "" {
		tclog.SetDefault(tclog.NewNoopLogger())
	}
}

// Main runs the package's tests and stops the container afterwards. Every
// package that uses NewDB calls it from TestMain:
//
//	func TestMain(m *testing.M) { testcontainers.Main(m) }
func Main(m *testing.M) {
	configure()
	mainActive.Store(true)
	code := m.Run()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	serverMu.Lock()
	owned := append([]*Server{server}, extraOwners...)
	serverMu.Unlock()
	for _, s := range owned {
		if s != nil {
			s.Terminate(ctx)
		}
	}
	serverMu.Lock()
	hooks := exitHooks
	serverMu.Unlock()
	for _, f := range hooks {
		f(ctx)
	}
	os.Exit(code)
}

// atExit runs f when Main ends, after the tests.
func atExit(f func(context.Context)) {
	serverMu.Lock()
	defer serverMu.Unlock()
	exitHooks = append(exitHooks, f)
}

// DB is one test's own database with mefor's schema applied.
type DB struct {
	Name string
	URL  string
	Pool *pgxpool.Pool
	// Server is the container holding it (to stop it or learn its address).
	Server *Server
}

// TracedPool opens another pool on the database, with its Pool's settings,
// whose connections report every statement to tracer; it is closed when
// the test ends. A test that counts or inspects what some code sends
// passes it that pool and does its own reads through Pool, which the
// tracer does not see.
func (d *DB) TracedPool(t testing.TB, tracer pgx.QueryTracer) *pgxpool.Pool {
	t.Helper()
	cfg := d.Pool.Config().Copy()
	cfg.ConnConfig.Tracer = tracer
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatalf("traced pool on %s: %v", d.Name, err)
	}
	t.Cleanup(pool.Close)
	return pool
}

type options struct {
	empty bool
}

// Option changes what NewDB sets up.
type Option func(*options)

// Empty gives a database without any migrations applied (for migration tests).
func Empty() Option { return func(o *options) { o.empty = true } }

// NewDB returns a fresh database for this test, dropped when the test ends.
func NewDB(t testing.TB, opts ...Option) *DB {
	t.Helper()
	if !mainActive.Load() {
		t.Fatal("testcontainers.NewDB needs TestMain to call testcontainers.Main(m), which stops the container")
	}
	var o options
	for _, opt := range opts {
		opt(&o)
	}
	db, drop, err := newDB(!o.empty)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := drop(); err != nil {
			t.Log(err)
		}
	})
	return db
}

// ExampleDB is NewDB for example functions, which have no testing.TB: it
// panics where NewDB would fail the test, and the example drops the
// database with the function it returns. The package's TestMain must call
// Main, as for NewDB.
func ExampleDB() (*DB, func()) {
	if !mainActive.Load() {
		panic("testcontainers.ExampleDB needs TestMain to call testcontainers.Main(m), which stops the container")
	}
	db, drop, err := newDB(true)
	if err != nil {
		panic(err)
	}
	return db, func() {
		if err := drop(); err != nil {
			panic(err)
		}
	}
}

// newDB starts the binary's server on first use and creates a database on
// it, returning the function that drops it.
func newDB(migrated bool) (*DB, func() error, error) {
	serverOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		server, serverErr = StartServer(ctx)
		if serverErr == nil {
			serverErr = server.prepareTemplate(ctx)
		}
	})
	if serverErr != nil {
		return nil, nil, fmt.Errorf("start PostgreSQL for tests: %w", serverErr)
	}
	db, err := server.CreateDB(context.Background(), migrated)
	if err != nil {
		return nil, nil, fmt.Errorf("create test database: %w", err)
	}
	return db, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		db.Pool.Close()
		if err := server.DropDB(ctx, db.Name); err != nil {
			return fmt.Errorf("drop test database %s: %w", db.Name, err)
		}
		return nil
	}, nil
}

// NewServer starts a dedicated container for a test that needs one to itself
// (to stop it, pause it or cut it off). It is stopped when the test ends.
func NewServer(t testing.TB) *Server {
	t.Helper()
	if !mainActive.Load() {
		t.Fatal("testcontainers.NewServer needs TestMain to call testcontainers.Main(m)")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	s, err := StartServer(ctx)
	if err != nil {
		t.Fatalf("start PostgreSQL for test: %v", err)
	}
	serverMu.Lock()
	extraOwners = append(extraOwners, s)
	serverMu.Unlock()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		s.Terminate(ctx)
	})
	if err := s.prepareTemplate(ctx); err != nil {
		t.Fatalf("migrate template: %v", err)
	}
	return s
}

// Image is the PostgreSQL image the harness runs.
func Image(ctx context.Context) string {
	if img := os.Getenv("MEFOR_PG_IMAGE"); img != "" {
		return img
	}
	if imageExists(ctx, LocalImage) {
		return LocalImage
	}
	return PublicImage
}

// StartServer starts a labelled PostgreSQL container and waits until it
// accepts connections. Stale containers of dead test processes are removed
// first.
func StartServer(ctx context.Context) (*Server, error) {
	configure()
	sweepStale(ctx)

	host, _ := os.Hostname()
	img := Image(ctx)
	args := []string{"postgres", "-c", "max_connections=400"}
	durable := envOn("MEFOR_PG_DURABLE")
	if !durable {
		// Every test starts from empty tables. Prepared statements cached
		// while a table is tiny get seq-scan generic plans, and only an
		// ANALYZE (which autovacuum runs once a minute by default)
		// invalidates them; with a one-second nap the plans follow the
		// tables as a test fills them. The durable server (the bench's)
		// keeps PostgreSQL's minute, as a production server does: a
		// one-second nap sends a worker to one of the server's databases
		// several times a second, which costs CPU per message and lowers
		// River's no-op figure alike.
		args = append(args, "-c", "autovacuum_naptime=1")
	}
	// Where the engine shares this network namespace, the container uses
	// the host network and listens on a loopback port of its own: a
	// published port would route every query through docker-proxy, a
	// userland copy loop that can cost more CPU than PostgreSQL itself.
	// MEFOR_PG_NETWORK=bridge keeps the published port.
	hostNet := os.Getenv("MEFOR_PG_NETWORK") != "bridge" && engineIsLocal()
	port := "5432"
	if hostNet {
		p, err := freeLoopbackPort()
		if err != nil {
			return nil, err
		}
		port = p
		args = append(args, "-c", "listen_addresses=127.0.0.1", "-c", "port="+port)
	}
	if !durable {
		// fsync dominates test time, and no test crashes the machine: the
		// one that crashes PostgreSQL kills a server process, which loses
		// its WAL buffers, not what it wrote to the operating system.
		args = append(args, "-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off")
	}
	if envOn("MEFOR_PG_STATEMENTS") {
		// Benchmarks read per-statement times, planning included (a
		// statement planned at every execution costs the server more
		// than running it); the extension's view still needs CREATE
		// EXTENSION in the database that reads it.
		// MEFOR_PG_STATEMENTS=all also counts the statements run inside
		// functions and triggers, each on its own line.
		track := "top"
		if os.Getenv("MEFOR_PG_STATEMENTS") == "all" {
			track = "all"
		}
		args = append(args, "-c", "shared_preload_libraries=pg_stat_statements", "-c", "pg_stat_statements.track="+track,
			"-c", "pg_stat_statements.track_planning=on", "-c", "track_wal_io_timing=on")
	}
	// MEFOR_PG_SETTINGS adds server settings, space-separated name=value
	// pairs, for a diagnosis the switches above do not cover (for example
	// "log_lock_waits=on deadlock_timeout=5ms", read with docker logs).
	for _, kv := range strings.Fields(os.Getenv("MEFOR_PG_SETTINGS")) {
		if !strings.Contains(kv, "=") {
			return nil, fmt.Errorf("MEFOR_PG_SETTINGS: %q is not name=value", kv)
		}
		args = append(args, "-c", kv)
	}
	var opts []tc.ContainerCustomizer
	if !hostNet {
		opts = append(opts, tc.WithExposedPorts("5432/tcp"))
	}
	opts = append(opts, tc.WithHostConfigModifier(func(hc *container.HostConfig) {
		if hostNet {
			hc.NetworkMode = "host"
		}
		if durable {
			// An anonymous volume: real disk, where an fsync costs what it
			// costs in production (on tmpfs it is free), and removed with the
			// container, by Terminate and by the orphan sweep alike (both
			// remove with RemoveVolumes), so nothing is left behind.
			hc.Mounts = append(hc.Mounts, mount.Mount{Type: mount.TypeVolume, Target: dataDir})
		} else {
			// Test data lives in memory: it keeps test I/O off the engine's
			// (often FUSE) storage driver. Both images chown it at start.
			hc.Tmpfs = map[string]string{dataDir: "rw"}
		}
	}))
	ctr, err := tc.Run(ctx, img, append(opts,
		tc.WithEnv(map[string]string{"POSTGRES_USER": user, "POSTGRES_PASSWORD": password}),
		// The public image's init phase listens on its socket only, so an
		// answer over TCP means the real server is up. (The port strategy's
		// in-container probe spins exec calls without pause and is slow on a
		// busy 2-core machine.)
		tc.WithWaitStrategy(wait.ForExec([]string{"pg_isready", "-q", "-h", "127.0.0.1", "-p", port, "-U", user}).
			WithPollInterval(200*time.Millisecond).WithStartupTimeout(90*time.Second)),
		tc.WithCmd(args...),
		tc.WithLabels(map[string]string{
			labelOwner:   "1",
			labelPID:     strconv.Itoa(os.Getpid()),
			labelHost:    host,
			labelStarted: strconv.FormatInt(time.Now().Unix(), 10),
		}),
	)...)
	if err != nil {
		if ctr != nil {
			_ = ctr.Terminate(context.Background())
		}
		return nil, fmt.Errorf("run %s (build it with testcontainers/pgimage/build.sh, or set MEFOR_PG_IMAGE): %w", img, err)
	}
	s := &Server{container: ctr, host: "127.0.0.1", port: port}
	if !hostNet {
		if s.host, err = ctr.Host(ctx); err != nil {
			s.Terminate(ctx)
			return nil, fmt.Errorf("container host: %w", err)
		}
		mapped, err := ctr.MappedPort(ctx, "5432/tcp")
		if err != nil {
			s.Terminate(ctx)
			return nil, fmt.Errorf("container port: %w", err)
		}
		s.port = mapped.Port()
	}
	if s.admin, err = connectWithRetry(ctx, s.URL("postgres")); err != nil {
		s.Terminate(ctx)
		return nil, err
	}
	return s, nil
}

// URL is a connection string for database name on this server.
func (s *Server) URL(name string) string {
	u := url.URL{
		Scheme:   "postgres",
		User:     url.UserPassword(user, password),
		Host:     net.JoinHostPort(s.host, s.port),
		Path:     "/" + name,
		RawQuery: "sslmode=disable",
	}
	return u.String()
}

// Container is the underlying testcontainers container, for tests that stop,
// pause or disconnect it.
func (s *Server) Container() *tc.DockerContainer { return s.container }

// Terminate stops and removes the container.
func (s *Server) Terminate(ctx context.Context) {
	if s.admin != nil {
		s.admin.Close()
	}
	if s.container != nil {
		if err := s.container.Terminate(ctx); err != nil {
			slog.Warn("terminate test postgres", "container", s.container.GetContainerID(), "error", err)
		}
	}
}

func (s *Server) prepareTemplate(ctx context.Context) error {
	if _, err := s.admin.Exec(ctx, "CREATE DATABASE "+templateDB); err != nil {
		return fmt.Errorf("create template database: %w", err)
	}
	pool, err := connectWithRetry(ctx, s.URL(templateDB))
	if err != nil {
		return err
	}
	defer pool.Close()
	if _, err := migrations.Migrate(ctx, pool, nil); err != nil {
		return fmt.Errorf("migrate template database: %w", err)
	}
	return nil
}

// CreateDB creates a new database, with the schema when migrated is true.
func (s *Server) CreateDB(ctx context.Context, migrated bool) (*DB, error) {
	name := fmt.Sprintf("t%d_%d", os.Getpid(), s.counter.Add(1))
	stmt := "CREATE DATABASE " + pgx.Identifier{name}.Sanitize()
	if migrated {
		stmt += " TEMPLATE " + templateDB
	}
	s.createMu.Lock()
	_, err := s.admin.Exec(ctx, stmt)
	s.createMu.Unlock()
	if err != nil {
		return nil, fmt.Errorf("create database %s: %w", name, err)
	}
	url := s.URL(name)
	pool, err := connectWithRetry(ctx, url)
	if err != nil {
		return nil, err
	}
	return &DB{Name: name, URL: url, Pool: pool, Server: s}, nil
}

// DropDB drops a database, disconnecting whoever still uses it.
func (s *Server) DropDB(ctx context.Context, name string) error {
	_, err := s.admin.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)")
	return err
}

func connectWithRetry(ctx context.Context, dsn string) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, fmt.Errorf("parse test database url: %w", err)
	}
	cfg.MaxConns = 20
	var pool *pgxpool.Pool
	backoff := retry.WithMaxDuration(30*time.Second, retry.NewConstant(100*time.Millisecond))
	err = retry.Do(ctx, backoff, func(ctx context.Context) error {
		p, err := pgxpool.NewWithConfig(ctx, cfg)
		if err != nil {
			return retry.RetryableError(err)
		}
		if err := p.Ping(ctx); err != nil {
			p.Close()
			return retry.RetryableError(err)
		}
		pool = p
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("connect to test postgres at %s: %w", cfg.ConnConfig.Host, err)
	}
	return pool, nil
}

// envOn reports whether a switch variable is set to something other than
// "" or "0".
func envOn(name string) bool {
	v := os.Getenv(name)
	return v != "" && v != "0"
}

// engineIsLocal reports whether the Docker engine runs in this network
// namespace: its docker0 bridge is one of our interfaces.
func engineIsLocal() bool {
	_, err := net.InterfaceByName("docker0")
	return err == nil
}

// freeLoopbackPort picks a loopback port nothing listens on right now.
func freeLoopbackPort() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", fmt.Errorf("find a free port for test postgres: %w", err)
	}
	defer ln.Close()
	_, port, _ := net.SplitHostPort(ln.Addr().String())
	return port, nil
}
