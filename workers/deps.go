// Package workers holds mefor's River workers: the three stage drainers and
// the periodic maintenance jobs.
//
// A drainer serves one lane. It reads the lane's pending rows head first,
// hands each off in a transaction that first proves the execution is still
// the live one (fencing), and ends in one of three ways: the lane is empty
// (it completes itself under the lane lock), its time slice is used up (it
// snoozes for zero so any node picks it up again), or the head must wait for
// a retry (it snoozes until then, keeping the lane blocked behind its head).
package workers

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/mefor/mefor/internal/config"
	"github.com/mefor/mefor/internal/connector"
	"github.com/mefor/mefor/internal/crypt"
	"github.com/mefor/mefor/internal/drainer"
	"github.com/mefor/mefor/internal/hl7"
	"github.com/mefor/mefor/internal/metrics"
	"github.com/mefor/mefor/internal/state"
)

// Graph is the running configuration as the drainers use it. It is looked up
// per batch so a reload takes effect between batches.
type Graph interface {
	// Route picks the routes of a channel that match msg. ok is false when
	// the channel is no longer configured.
	Route(channel string, msg *hl7.Message) (outs []drainer.RoutedOut, ok bool)
	// Transform runs a route's handler and returns the deliveries it
	// produced (none: filtered). An error dead-letters the row; its text
	// must not contain message content. It wraps ErrNotInConfig when what
	// the row needs is not in the config. st is the row's view of transform
	// state, for handlers that keep some.
	Transform(ctx context.Context, row drainer.Row, msg *hl7.Message, st *state.Row) ([]drainer.OutboundOut, error)
	// Destination returns a destination's config, nil when it left the config.
	Destination(name string) *config.Destination
}

// Limits bound one drainer execution.
type Limits struct {
	// Slice is how long one execution may keep its lane before it yields
	// (snoozes for zero) so other lanes get worker slots; each execution
	// keeps it up to a quarter longer, at random, so that drainers started
	// together do not keep yielding together. Defaults to 5s.
	Slice time.Duration
	// MaxRows bounds the rows served in one execution. Defaults to 5000.
	MaxRows int
	// Batch is how many rows of a lane are read at once; route and
	// transform hand a whole batch off in one transaction. Defaults to 100.
	Batch int
	// Linger is how long a drainer waits on an empty lane for new work
	// before completing itself; re-activating costs a job insert and fetch.
	// Defaults to 200ms.
	Linger time.Duration
	// Poll is how often a lingering drainer without a Wake looks at its
	// lane for work; with one it does not poll (see linger). Defaults to
	// 50ms.
	Poll time.Duration
	// Gather is how long a lingering drainer, woken by this node's commit
	// on a lane that gets a row at least every Gather while the host's CPUs
	// are contended (Deps.Contended), waits before it reads, so that the
	// rows committed meanwhile share its read and its hand-off transaction
	// (see gather). Zero reads at once. Defaults to 6ms: long enough for a
	// busy lane's next rows to join the read, and at most that much delivery
	// latency per stage.
	Gather time.Duration
	// Hold is how long one execution may keep its lane, slice after slice,
	// while no drainer of its stage queue is waiting for a worker slot: a
	// yield then frees a slot nobody wants, and costs River a snooze, a
	// fetch and the next execution's first read. Zero (or less than
	// Slice): an execution keeps its lane for one slice only. Defaults to
	// 20s.
	Hold time.Duration
}

// Longest is how long one execution may run at most, its last step
// included (a transform batch stops taking rows after Slice), before a
// slow send: the job time limits are this plus a margin.
func (l Limits) Longest() time.Duration {
	return max(l.Hold, l.Slice*5/4) + l.Slice
}

// DefaultLimits suit a 2-core node; a zero Limits in engine.Options means
// these.
var DefaultLimits = Limits{
	Slice:   5 * time.Second,
	MaxRows: 5000,
	Batch:   100,
	Linger:  200 * time.Millisecond,
	Poll:    50 * time.Millisecond,
	Gather:  6 * time.Millisecond,
	Hold:    20 * time.Second,
}

// Deps is what every drainer needs.
type Deps struct {
	Pool    *pgxpool.Pool
	Graph   func() Graph
	Senders *connector.Pool
	// Wake carries this node's "lane has work" signals; nil means poll only.
	Wake   *Wake
	Limits Limits
	Logger *slog.Logger
	// ConfigAgreed, when set, reports whether this node's config is the
	// cluster's agreed one (every live node applied it, from the same
	// file). Only then is a row for a channel, route, handler or
	// destination this node does not know dead-lettered; otherwise its
	// drainer yields the lane at once without touching it, so that a node
	// that knows it serves it. Unset means agreed (a lone node in tests).
	ConfigAgreed func(ctx context.Context) bool
	// Alive, when set, reports whether the rest of the cluster still
	// counts this node as live; an outbound drainer checks it right before
	// each send and stops without sending when it is false. A node that
	// resumes from a freeze (or was cut off) past node_timeout has had its
	// drainers handed on, and a late send would reach the partner after the
	// replacement's, out of order.
	Alive func() bool
	// Stopping is closed when the node begins a graceful stop: drainers
	// finish the row in hand and yield their lane.
	Stopping <-chan struct{}
	// State is the node's transform state cache; nil works, with more
	// re-runs.
	State *state.Cache
	// Metrics counts delivery attempts, dead letters and maintenance runs;
	// nil counts nothing.
	Metrics *metrics.Metrics
	// Keys opens the content drainers read and seals what they write; nil
	// means encryption is off.
	Keys *crypt.Keyring
	// Contended reports whether the host's CPUs are contended right now
	// (cpupressure.Gauge.Busy); only then does a woken drainer gather. Nil
	// means never: every drainer reads at once.
	Contended func() bool
	// Handoffs, when set, lets route and transform hand-offs of this
	// node's drainers share transactions; nil commits each alone.
	Handoffs *Handoffs
	// Reads, when set, lets lane reads of this node's drainers made at the
	// same moment share a round trip; nil reads each lane alone.
	Reads *Reads
}

// unknownRetry is how long a lane whose head this node does not know is
// left to the other nodes before this node looks at it again.
const unknownRetry = time.Second

// unopenedRetry is how often a lane whose head does not open (its key is
// not in this node's keyring) looks again.
const unopenedRetry = 5 * time.Second

// heldRetry is how often a lane held behind the lanes of its destination's
// previous ordering looks again.
const heldRetry = 300 * time.Millisecond

// unknownPolicy returns mayDeadLetterUnknown asked at most once: a batch
// with several unknown rows costs one look at the cluster.
func (d *Deps) unknownPolicy() func(context.Context) bool {
	var asked, may bool
	return func(ctx context.Context) bool {
		if !asked {
			asked, may = true, d.mayDeadLetterUnknown(ctx)
		}
		return may
	}
}

// ErrNotInConfig is wrapped by Graph.Transform's error when the row's
// route, handler or a destination of its route is not in the config.
var ErrNotInConfig = errors.New("not in the config")

// mayDeadLetterUnknown reports whether a row this node's config does not
// know may be dead-lettered (see ConfigAgreed).
func (d *Deps) mayDeadLetterUnknown(ctx context.Context) bool {
	return d.ConfigAgreed == nil || d.ConfigAgreed(ctx)
}

func (d *Deps) stopping() bool {
	select {
	case <-d.Stopping:
		return true
	default:
		return false
	}
}
