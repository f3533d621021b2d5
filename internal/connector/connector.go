// Package connector delivers messages to destinations (an MLLP partner, an
// HTTP endpoint, a directory) and classifies each attempt's outcome. Failure descriptions
// name the failure class and the partner address, never message content.
package connector

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"syscall"
	"time"

	"github.com/mefor/mefor/internal/config"
	"github.com/mefor/mefor/internal/egress"
	"github.com/mefor/mefor/internal/hl7"
	"github.com/mefor/mefor/internal/mllp"
	"github.com/mefor/mefor/internal/tlsconf"
)

// Outcome classes, recorded in mefor_response.outcome and at the start of
// last_error, so `mefor dead list` tells a refused connection from a partner
// that rejected the message.
const (
	OutcomeDelivered = "delivered"
	OutcomeRefused   = "refused"  // nothing listening / connection failed
	OutcomeTimeout   = "timeout"  // no ACK within ack_timeout
	OutcomeClosed    = "closed"   // partner closed before answering
	OutcomeAE        = "AE"       // application error ACK
	OutcomeAR        = "AR"       // application reject ACK
	OutcomeBadAck    = "bad-ack"  // the reply was not a readable ACK
	OutcomeTLS       = "tls"      // the TLS handshake failed: nothing was sent
	OutcomeEgress    = "egress"   // egress.allow refused the address reached (its DNS answer changed): nothing was sent
	OutcomeIOError   = "io-error" // writing a file failed
	// OutcomeBadName: the file name built for the message cannot be
	// written (too long, a symlink or a non-directory in its path, no free
	// suffix); sending again cannot help, so the row is dead-lettered.
	OutcomeBadName  = "bad-name"
	OutcomeInternal = "internal" // anything else
	// OutcomeCrashed is recorded by the drainer that takes a lane over
	// from one that died: the head may have been in flight, its outcome
	// unknown.
	OutcomeCrashed = "crashed"
)

// Delivery is one message to deliver and what it is known by.
type Delivery struct {
	MessageID   int64
	WorkID      int64
	Seq         int64
	Lane        string
	Channel     string
	Destination string
	ControlID   string
	MessageType string
	Received    time.Time
	Payload     []byte
}

// Result is the outcome of one attempt.
type Result struct {
	OK      bool
	Outcome string
	AckCode string
	Reply   []byte
	// Error describes a failure for last_error; empty on success.
	Error string
	// RetryAfter is how long the partner asked to be left alone (an HTTP
	// Retry-After), zero when it did not say.
	RetryAfter time.Duration
}

// Sender delivers to one destination.
type Sender interface {
	Send(ctx context.Context, d Delivery) Result
	Close() error
}

// Pool keeps one sender per outbound lane: a lane is drained by one drainer
// at a time, so an MLLP lane reuses one connection, and N lanes of a
// parallel destination are N connections.
type Pool struct {
	mu      sync.Mutex
	senders map[string]Sender
	built   map[string]senderKey // the settings each lane's sender was built from
	tls     *tlsconf.Set
	egress  *egress.Gate
}

// NewPool returns an empty pool.
func NewPool() *Pool { return &Pool{senders: map[string]Sender{}, built: map[string]senderKey{}} }

// UseTLS makes the pool's MLLP and HTTP senders take their TLS configuration from
// set. The set is read at each new connection, so certificates it renews
// apply to the lane's next connection, not to the one in use. Call it
// before the first Get.
func (p *Pool) UseTLS(set *tlsconf.Set) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.tls = set
}

// UseEgress makes the pool's MLLP and HTTP senders connect through the
// egress policy in force in g, read at each new connection, so a reload
// applies to the lane's next connection. Call it before the first Get.
func (p *Pool) UseEgress(g *egress.Gate) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.egress = g
}

// Get returns the lane's sender, creating it for dest on first use. A
// sender built from other settings (a config reload changed the address,
// timeouts or directory) is closed and replaced, so the next send uses the
// new settings. That cannot cut a send short: only the lane's drainer calls
// Get for its lane, and it does so between sends.
func (p *Pool) Get(lane string, dest *config.Destination) (Sender, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	key := keyOf(dest)
	if s, ok := p.senders[lane]; ok {
		if p.built[lane] == key {
			return s, nil
		}
		_ = s.Close() // an idle connection to the old settings; nothing to report
		delete(p.senders, lane)
	}
	var tc *tlsconf.Client
	if p.tls != nil {
		tc = p.tls.Client(dest.Name)
	}
	var dial egress.DialFunc
	if p.egress != nil {
		dial = p.egress.Dialer(EgressTarget(dest.Name))
	}
	s, err := New(dest, tc, dial)
	if err != nil {
		return nil, err
	}
	p.senders[lane] = s
	p.built[lane] = key
	return s, nil
}

// senderKey is what a sender is built from; two destinations with equal
// keys can share a sender.
type senderKey struct {
	typ           config.DestinationType
	mllp          config.MLLPDestination
	dir, filename string
	http          string
}

func keyOf(dest *config.Destination) senderKey {
	k := senderKey{typ: dest.Type}
	if dest.MLLP != nil {
		k.mllp = *dest.MLLP
	}
	if dest.File != nil {
		k.dir, k.filename = dest.File.Directory, dest.File.Filename
	}
	k.http = httpKey(dest.HTTP)
	return k
}

// Close closes every sender.
func (p *Pool) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	var errs []error
	for lane, s := range p.senders {
		errs = append(errs, s.Close())
		delete(p.senders, lane)
		delete(p.built, lane)
	}
	return errors.Join(errs...)
}

// EgressTarget is how a destination is named in egress refusals and in
// mefor_egress_refused_total.
func EgressTarget(destination string) string { return "destination:" + destination }

// New builds the sender for a destination. tc is the destination's TLS
// configuration, required when its settings enable TLS. dial opens its
// connections (an egress policy's); nil dials directly.
func New(dest *config.Destination, tc *tlsconf.Client, dial egress.DialFunc) (Sender, error) {
	switch dest.Type {
	case config.DestinationMLLP:
		client := &mllp.Client{
			Addr:        dest.MLLP.Address,
			DialTimeout: dest.MLLP.ConnectTimeout,
			AckTimeout:  dest.MLLP.AckTimeout,
			Dialer:      dial,
		}
		if dest.MLLP.TLS.Enabled {
			if tc == nil {
				return nil, fmt.Errorf("destination %q: TLS is configured but its certificates were not loaded", dest.Name)
			}
			client.Dialer = mllp.TLSDialerVia(dial, tc.Config)
		}
		return &MLLPSender{client: client, aeIsFailure: dest.MLLP.AEIsFailure}, nil
	case config.DestinationFile:
		return &FileSender{dest: dest.File}, nil
	case config.DestinationHTTP:
		return newHTTPSender(dest, tc, dial)
	}
	return nil, fmt.Errorf("destination %q: unsupported type %q", dest.Name, dest.Type)
}

// MLLPSender delivers over MLLP and reads the partner's ACK.
type MLLPSender struct {
	client      *mllp.Client
	aeIsFailure bool
}

// Send sends one message and classifies the reply.
func (s *MLLPSender) Send(ctx context.Context, d Delivery) Result {
	reply, err := s.client.Send(ctx, d.Payload)
	if err != nil {
		return classifySendError(s.client.Addr, err)
	}
	ack, err := hl7.ParseACK(reply)
	if err != nil {
		return Result{Outcome: OutcomeBadAck, Reply: reply,
			Error: fmt.Sprintf("%s: reply from %s is not an ACK (%v)", OutcomeBadAck, s.client.Addr, err)}
	}
	code := string(ack.Code)
	switch ack.Code {
	case hl7.AckAccept, hl7.AckCommitAccept:
		return Result{OK: true, Outcome: OutcomeDelivered, AckCode: code, Reply: reply}
	case hl7.AckError, hl7.AckCommitError:
		if !s.aeIsFailure {
			return Result{OK: true, Outcome: OutcomeDelivered, AckCode: code, Reply: reply}
		}
		// MSA-3 is the partner's text and may quote the message: keep it in
		// the stored reply, not in last_error.
		return Result{Outcome: OutcomeAE, AckCode: code, Reply: reply,
			Error: fmt.Sprintf("%s: %s answered %s (application error)", OutcomeAE, s.client.Addr, code)}
	default:
		return Result{Outcome: OutcomeAR, AckCode: code, Reply: reply,
			Error: fmt.Sprintf("%s: %s answered %s (rejected)", OutcomeAR, s.client.Addr, code)}
	}
}

func classifySendError(addr string, err error) Result {
	var dial *mllp.DialError
	var hs *mllp.HandshakeError
	var refused *egress.RefusedError
	switch {
	case errors.As(err, &refused):
		return Result{Outcome: OutcomeEgress, Error: fmt.Sprintf("%s: %s; nothing was delivered", OutcomeEgress, refused.Detail())}
	case errors.As(err, &hs):
		return Result{Outcome: OutcomeTLS, Error: fmt.Sprintf("%s: TLS handshake with %s failed, %s; nothing was delivered (%v)",
			OutcomeTLS, addr, hs.Reason, hs.Err)}
	case errors.As(err, &dial) && errors.Is(err, syscall.ECONNREFUSED):
		return Result{Outcome: OutcomeRefused, Error: fmt.Sprintf("%s: connection refused by %s", OutcomeRefused, addr)}
	case errors.As(err, &dial):
		return Result{Outcome: OutcomeRefused, Error: fmt.Sprintf("%s: cannot connect to %s: %v", OutcomeRefused, addr, dial.Err)}
	case errors.Is(err, mllp.ErrAckTimeout), errors.Is(err, context.DeadlineExceeded):
		return Result{Outcome: OutcomeTimeout, Error: fmt.Sprintf("%s: no ACK from %s in time", OutcomeTimeout, addr)}
	case errors.Is(err, mllp.ErrConnClosed):
		return Result{Outcome: OutcomeClosed, Error: fmt.Sprintf("%s: %s closed the connection before answering", OutcomeClosed, addr)}
	}
	return Result{Outcome: OutcomeInternal, Error: fmt.Sprintf("%s: send to %s: %v", OutcomeInternal, addr, err)}
}

// Close closes the connection.
func (s *MLLPSender) Close() error { return s.client.Close() }
