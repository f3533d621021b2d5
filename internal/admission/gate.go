package admission

import (
	"errors"
	"log/slog"
	"net"
	"net/netip"
	"sync"
	"time"
)

// Policy is what a listener admits. The zero value admits every source
// without limit.
type Policy struct {
	// Allow lists the sources that may connect. Nil admits any source.
	Allow *Sources
	// MaxConnections caps the connections the listener holds at once;
	// zero means no cap.
	MaxConnections int
	// MaxConnectionsPerIP caps the connections the listener holds at once
	// from one source address; zero means no cap.
	MaxConnectionsPerIP int
}

// Options are a Gate's outputs.
type Options struct {
	// Refused, when set, is called once for each refused connection, with
	// its reason; it counts them (mefor_connections_refused_total).
	Refused func(Reason)
	// Logger receives the refusals, at most one line per source address
	// per LogEvery. Nil means no logging.
	Logger *slog.Logger
	// LogEvery is how often one source's refusals are logged. Defaults to
	// a minute.
	LogEvery time.Duration
}

// maxLogged bounds the sources whose last log line the gate remembers. A
// sender with many addresses (an IPv6 network) cannot grow it further;
// once it is full, refusals from new sources are logged together, once
// per LogEvery.
const maxLogged = 4096

// Gate admits or refuses a listener's connections by its Policy, and
// counts the connections it holds. It is safe for concurrent use.
type Gate struct {
	policy Policy
	opts   Options

	mu     sync.Mutex
	open   int
	perIP  map[netip.Addr]int
	logged map[netip.Addr]*logState
	// overflow is the log state of sources refused while logged was full.
	overflow logState
	// now is the clock of the refusal log; tests turn it.
	now func() time.Time
}

// logState is one source's refusal log: when its last line was written,
// and how many refusals were not logged since.
type logState struct {
	at         time.Time
	suppressed int
}

// NewGate returns a gate applying p.
func NewGate(p Policy, opts Options) *Gate {
	if opts.LogEvery <= 0 {
		opts.LogEvery = time.Minute
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	return &Gate{policy: p, opts: opts, perIP: map[netip.Addr]int{}, logged: map[netip.Addr]*logState{}, now: time.Now}
}

// Open is how many connections the gate holds now.
func (g *Gate) Open() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.open
}

// Listener wraps ln: its Accept returns only the connections the gate
// admits, each counted until it is closed, and closes the others at once,
// unread.
func (g *Gate) Listener(ln net.Listener) net.Listener {
	return &listener{Listener: ln, gate: g}
}

// admit decides on a connection from remote. When it is admitted, release
// must be called once it is closed.
func (g *Gate) admit(remote net.Addr) (release func(), reason Reason, ok bool) {
	ip, known := addrOf(remote)
	if g.policy.Allow != nil && (!known || !g.policy.Allow.Allows(ip)) {
		return nil, NotAllowed, false
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if max := g.policy.MaxConnections; max > 0 && g.open >= max {
		return nil, MaxConnections, false
	}
	if max := g.policy.MaxConnectionsPerIP; max > 0 && g.perIP[ip] >= max {
		return nil, MaxConnectionsPerIP, false
	}
	g.open++
	g.perIP[ip]++
	var once sync.Once
	return func() {
		once.Do(func() {
			g.mu.Lock()
			defer g.mu.Unlock()
			g.open--
			if g.perIP[ip]--; g.perIP[ip] <= 0 {
				delete(g.perIP, ip)
			}
		})
	}, "", true
}

// Refused counts and logs a connection refused for reason: by the gate
// itself, or later by the server (a TLS handshake). attrs are added to the
// log line; they must not hold message content.
func (g *Gate) Refused(remote net.Addr, reason Reason, attrs ...any) {
	if g.opts.Refused != nil {
		g.opts.Refused(reason)
	}
	g.log(remote, reason, attrs)
}

// log writes a refusal's line unless this source had one within LogEvery;
// a line carries how many of the source's refusals since its last line
// were not logged.
func (g *Gate) log(remote net.Addr, reason Reason, attrs []any) {
	ip, _ := addrOf(remote)
	g.mu.Lock()
	now := g.now()
	st, ok := g.logged[ip]
	if !ok {
		if len(g.logged) >= maxLogged {
			g.pruneLocked(now)
		}
		if len(g.logged) < maxLogged {
			st = &logState{}
			g.logged[ip] = st
		}
	}
	many := st == nil
	if many {
		st = &g.overflow
	}
	if !st.at.IsZero() && now.Sub(st.at) < g.opts.LogEvery {
		st.suppressed++
		g.mu.Unlock()
		return
	}
	suppressed := st.suppressed
	st.at, st.suppressed = now, 0
	g.mu.Unlock()

	line := []any{"remote_addr", addrString(remote), "reason", string(reason)}
	if suppressed > 0 {
		line = append(line, "not_logged_since_last", suppressed)
	}
	line = append(line, attrs...)
	if many {
		g.opts.Logger.Warn("connections refused from many sources; logging one line a minute for the sources past the first few thousand", line...)
		return
	}
	g.opts.Logger.Warn("connection refused", line...)
}

// pruneLocked forgets the sources last logged more than LogEvery ago.
func (g *Gate) pruneLocked(now time.Time) {
	for ip, st := range g.logged {
		if now.Sub(st.at) >= g.opts.LogEvery {
			delete(g.logged, ip)
		}
	}
}

func addrString(a net.Addr) string {
	if a == nil {
		return ""
	}
	return a.String()
}

// listener is a net.Listener whose Accept applies its gate.
type listener struct {
	net.Listener
	gate *Gate
}

// Accept returns the next admitted connection. A refused one is closed
// here, before anything reads from it, and Accept waits for the next.
func (l *listener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		release, reason, ok := l.gate.admit(c.RemoteAddr())
		if ok {
			return &conn{Conn: c, release: release}, nil
		}
		// Counted before the close, so whoever sees the connection end
		// finds the refusal already in the metrics.
		l.gate.Refused(c.RemoteAddr(), reason)
		c.Close()
	}
}

// conn is an admitted connection; closing it frees its place.
type conn struct {
	net.Conn
	release func()
}

func (c *conn) Close() error {
	err := c.Conn.Close()
	c.release()
	return err
}

// CloseWrite half-closes the connection when the underlying one can, as
// a *net.TCPConn does; servers use it to finish an answer before closing.
func (c *conn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return errors.ErrUnsupported
}

// NetConn returns the connection the gate admitted.
func (c *conn) NetConn() net.Conn { return c.Conn }
