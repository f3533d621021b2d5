package cluster

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"io"
	"net"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"
)

// Proxy forwards loopback connections to PostgreSQL. Cut blackholes every
// connection, existing and new, without closing anything, as a network
// partition does: the node sees no error, only silence, and PostgreSQL keeps
// the node's sessions, with their open transactions and locks. Heal closes
// the blackholed connections (their state is lost) and forwards new ones
// again.
//
// The proxy follows the protocol's message framing, so CutHoldingLaneLock
// can cut at the worst moment: right after a session took a lane lock in a
// transaction it has not committed.
type Proxy struct {
	ln     net.Listener
	target string

	mu    sync.Mutex
	cond  *sync.Cond
	cut   bool
	armed bool // cut when a session holds a lane lock in an open transaction
	pairs map[*proxyPair]bool
}

type proxyPair struct {
	client, upstream net.Conn
	closed           bool

	stmts    map[string]string // prepared statement -> SQL, from the client's Parse messages
	lockSent bool              // a lane-lock statement ran since the last ReadyForQuery
}

// laneLockSQL marks the statement that takes a lane's transaction lock.
const laneLockSQL = "pg_advisory_xact_lock"

func NewProxy(t *testing.T, target string) *Proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &Proxy{ln: ln, target: target, pairs: map[*proxyPair]bool{}}
	p.cond = sync.NewCond(&p.mu)
	go p.accept()
	t.Cleanup(func() {
		_ = ln.Close()
		p.Heal()
	})
	return p
}

// URL is dbURL with its host replaced by the proxy.
func (p *Proxy) URL(t *testing.T, dbURL string) string {
	u, err := url.Parse(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	u.Host = p.ln.Addr().String()
	return u.String()
}

func (p *Proxy) accept() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		pp := &proxyPair{client: c, stmts: map[string]string{}}
		p.mu.Lock()
		p.pairs[pp] = true
		cut := p.cut
		p.mu.Unlock()
		if cut {
			continue // held, never forwarded; Heal closes it
		}
		go p.connect(pp)
	}
}

func (p *Proxy) connect(pp *proxyPair) {
	u, err := net.DialTimeout("tcp", p.target, 5*time.Second)
	p.mu.Lock()
	if err != nil || pp.closed {
		p.closeLocked(pp)
		p.mu.Unlock()
		if u != nil {
			u.Close()
		}
		return
	}
	pp.upstream = u
	p.mu.Unlock()
	go p.pipe(pp, pp.client, u, true)
	go p.pipe(pp, u, pp.client, false)
}

// pipe copies src to dst one protocol message at a time, swallowing what it
// reads while the link is cut. The client's first message (startup) has no
// type byte; every other message in both directions has one. sslmode=disable
// means no SSL negotiation byte comes first.
func (p *Proxy) pipe(pp *proxyPair, src, dst net.Conn, fromClient bool) {
	defer func() {
		p.mu.Lock()
		if !p.cut || pp.closed {
			p.closeLocked(pp)
		}
		p.mu.Unlock()
	}()
	r := bufio.NewReaderSize(src, 64<<10)
	typed := !fromClient
	for {
		var msg []byte
		hdr := 4
		if typed {
			hdr = 5
		}
		head := make([]byte, hdr)
		if _, err := io.ReadFull(r, head); err != nil {
			return
		}
		n := int(binary.BigEndian.Uint32(head[hdr-4:]))
		if n < 4 || n > 1<<30 {
			return // not the framing this proxy understands
		}
		msg = make([]byte, hdr+n-4)
		copy(msg, head)
		if _, err := io.ReadFull(r, msg[hdr:]); err != nil {
			return
		}
		typed = true

		p.mu.Lock()
		for p.cut && !pp.closed {
			p.cond.Wait()
		}
		if pp.closed {
			p.mu.Unlock()
			return
		}
		if hdr == 5 {
			if fromClient {
				pp.noteClient(msg[0], msg[5:])
			} else if msg[0] == 'Z' && len(msg) > 5 {
				// ReadyForQuery carries the session's transaction status.
				if p.armed && msg[5] == 'T' && pp.lockSent {
					p.cut, p.armed = true, false
					p.cond.Broadcast()
				}
				pp.lockSent = false
			}
		}
		p.mu.Unlock()
		if _, err := dst.Write(msg); err != nil {
			return
		}
	}
}

// noteClient tracks which statements the client runs: a simple Query, or a
// Bind of a statement it prepared with Parse.
func (pp *proxyPair) noteClient(typ byte, body []byte) {
	cstr := func(b []byte) (string, []byte) {
		i := bytes.IndexByte(b, 0)
		if i < 0 {
			return string(b), nil
		}
		return string(b[:i]), b[i+1:]
	}
	switch typ {
	case 'Q':
		q, _ := cstr(body)
		pp.lockSent = pp.lockSent || strings.Contains(q, laneLockSQL)
	case 'P':
		name, rest := cstr(body)
		q, _ := cstr(rest)
		pp.stmts[name] = q
	case 'B':
		_, rest := cstr(body) // portal
		stmt, _ := cstr(rest)
		pp.lockSent = pp.lockSent || strings.Contains(pp.stmts[stmt], laneLockSQL)
	}
}

func (p *Proxy) closeLocked(pp *proxyPair) {
	if pp.closed {
		return
	}
	pp.closed = true
	_ = pp.client.Close()
	if pp.upstream != nil {
		_ = pp.upstream.Close()
	}
	delete(p.pairs, pp)
}

// Cut blackholes the link in both directions.
func (p *Proxy) Cut() {
	p.mu.Lock()
	p.cut = true
	p.mu.Unlock()
}

// CutHoldingLaneLock cuts the link the moment one of the node's sessions
// reports an open transaction in which it took a lane lock: PostgreSQL keeps
// that session, and the lock, while the node hears nothing. It returns when
// it cut, and false when no such moment came within d (then it cut anyway).
func (p *Proxy) CutHoldingLaneLock(d time.Duration) (time.Time, bool) {
	p.mu.Lock()
	p.armed = true
	p.mu.Unlock()
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		p.mu.Lock()
		cut := p.cut
		p.mu.Unlock()
		if cut {
			return time.Now(), true
		}
		time.Sleep(time.Millisecond)
	}
	p.mu.Lock()
	p.armed, p.cut = false, true
	p.mu.Unlock()
	return time.Now(), false
}

// Heal closes every connection that lived through the cut and forwards new
// ones again.
func (p *Proxy) Heal() {
	p.mu.Lock()
	for pp := range p.pairs {
		p.closeLocked(pp)
	}
	p.cut = false
	p.cond.Broadcast()
	p.mu.Unlock()
}
