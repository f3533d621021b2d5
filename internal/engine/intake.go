package engine

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/mefor/mefor/internal/config"
	"github.com/mefor/mefor/internal/crypt"
	"github.com/mefor/mefor/internal/hl7"
	"github.com/mefor/mefor/internal/metrics"
	"github.com/mefor/mefor/internal/mllp"
	"github.com/mefor/mefor/internal/pipeline"
	"github.com/mefor/mefor/jobs"
	"github.com/mefor/mefor/leader"
	"github.com/mefor/mefor/workers"
)

// Intake stores received messages durably, then says what to answer.
type Intake struct {
	Pool     *pgxpool.Pool
	Inserter jobs.Inserter
	Logger   *slog.Logger
	Now      func() time.Time
	// Wake, when set, wakes this node's lingering ingress drainer after each
	// commit instead of leaving it to poll.
	Wake *workers.Wake
	// Gate, when set, is the listener lease: MLLP intake stores nothing
	// unless this node holds it, checked here and again in the storing
	// transaction against the lease row.
	Gate LeaseGate
	// Metrics counts received and rejected messages; nil counts nothing.
	Metrics *metrics.Metrics
	// Keys seals what is stored; nil stores it in clear.
	Keys *crypt.Keyring

	// Linger is how long the node's drainers wait on an empty lane before
	// completing (workers.Limits.Linger). A lane whose last message intake
	// stored longer ago than that has probably no live drainer: its
	// messages go straight to the transaction that activates one, not
	// first to the one round trip, which the database would refuse (and
	// log as an ERROR). Zero: always try the one round trip first.
	Linger time.Duration

	// ids are the message ids sealed intake draws ahead, a block at a time.
	ids pipeline.MessageIDs
	// group stores messages arriving together in one transaction.
	group groupCommit
	// lanes is when intake last stored a message into each ingress lane.
	// Intake of a channel runs on the listener lease's holder alone, so
	// this node sees every message of its lanes (but those of `mefor
	// enqueue`, for which a wrong guess costs a round trip, never a
	// message).
	lanes laneClock
	// onCommit, when set (by tests), is told the size of each batch as its
	// commit starts.
	onCommit func(messages int)
}

// LeaseGate is the part of the listener lease intake needs.
type LeaseGate interface {
	// Serving reports whether the node holds the lease right now.
	Serving() bool
	// Owner is the id the lease row names when this node holds it.
	Owner() string
}

// Result of storing one message.
type Received struct {
	MessageID int64
	Msg       *hl7.Message // nil when it did not parse
	ParseErr  error
}

// Receive parses and stores one message for channel in one transaction,
// which may also store other messages arriving at the same moment.
// A message that does not parse is stored too (status error, raw body kept
// for inspection); only a database failure returns an error, and then the
// message is not stored and must not be acknowledged.
func (in *Intake) Receive(ctx context.Context, channel, source, remote string, raw []byte) (Received, error) {
	return in.receive(ctx, channel, source, remote, raw, "", "", 0)
}

// receive stores one message; identity is the subject of the sender's
// verified client certificate, if any; keep, when positive, is how many
// bytes of a message that does not parse are stored.
func (in *Intake) receive(ctx context.Context, channel, source, remote string, raw []byte, leaseOwner, identity string, keep int) (Received, error) {
	inbound, msg, perr := pipeline.ParseInbound(channel, source, remote, raw)
	inbound.LeaseOwner, inbound.SourceIdentity, inbound.KeepUnparseable = leaseOwner, identity, keep
	inbound.Keys, inbound.IDs = in.Keys, &in.ids
	r := &commitReq{msg: inbound, queued: time.Now()}
	in.group.do(ctx, r, in.commitBatch)
	if r.err != nil {
		return Received{}, r.err
	}
	id := r.id
	in.Metrics.Received(channel)
	if perr == nil {
		in.Wake.Notify(jobs.IngressLane(channel))
	}
	return Received{MessageID: id, Msg: msg, ParseErr: perr}, nil
}

// MLLPHandler answers an MLLP listener of one channel: AA only after the
// commit; AR with the reason for a message that does not parse (stored all
// the same, its first keep_unparseable bytes, and marked rejected so that
// the server closes a connection that sends nothing else); and no answer at
// all, closing the connection, when the message could not be stored, so the
// sender keeps it and sends again.
func (in *Intake) MLLPHandler(ch *config.Channel) mllp.Handler {
	keep := 0
	if ch.Inbound.MLLP != nil {
		keep = int(ch.Inbound.MLLP.KeepUnparseable)
	}
	return mllp.HandlerFunc(func(ctx context.Context, raw []byte, conn mllp.ConnInfo) []byte {
		remote := ""
		if conn.RemoteAddr != nil {
			remote = conn.RemoteAddr.String()
		}
		owner := ""
		if in.Gate != nil {
			if !in.Gate.Serving() {
				in.Logger.WarnContext(ctx, "not the listener lease holder: closing connection without ACK",
					"channel", ch.Name, "remote", remote, "size", len(raw))
				in.Metrics.Rejected(ch.Name, metrics.RejectNotLeaseHolder)
				return nil
			}
			owner = in.Gate.Owner()
		}
		// The sender waits on this answer, but a node that is stopping still
		// commits what it accepted: do not let a cancelled connection
		// context abort a commit mid-way.
		rec, err := in.receive(context.WithoutCancel(ctx), ch.Name, "mllp", remote, raw, owner, conn.PeerSubject(), keep)
		if err != nil {
			in.Logger.ErrorContext(ctx, "message not stored, closing connection without ACK",
				"channel", ch.Name, "remote", remote, "size", len(raw), "error", err)
			reason := metrics.RejectNotStored
			switch {
			case errors.Is(err, leader.ErrNotLeaseHolder):
				reason = metrics.RejectNotLeaseHolder
			case pipeline.IsLockTimeout(err):
				reason = metrics.RejectLockTimeout
			}
			in.Metrics.Rejected(ch.Name, reason)
			return nil
		}
		now := in.now()
		if rec.ParseErr != nil {
			in.Logger.WarnContext(ctx, "rejected malformed message (stored for inspection)",
				"channel", ch.Name, "message_id", rec.MessageID, "remote", remote, "size", len(raw), "error", rec.ParseErr)
			in.Metrics.Rejected(ch.Name, metrics.RejectUnparseable)
			mllp.Reject(ctx)
			return hl7.NewACKForUnparsed(raw, hl7.AckReject,
				fmt.Sprintf("message %d rejected: %v", rec.MessageID, rec.ParseErr), hl7.NewControlID(), now)
		}
		in.Logger.DebugContext(ctx, "received", "channel", ch.Name, "message_id", rec.MessageID,
			"type", rec.Msg.MessageType(), "size", len(raw))
		return hl7.NewACK(rec.Msg, hl7.AckAccept, "", hl7.NewControlID(), now)
	})
}

// UnparseableInARow is told of a connection of channel that sent limit
// unparseable frames in a row, which the server then closes: logged once,
// with the sender's address, and counted.
func (in *Intake) UnparseableInARow(channel string, limit int) func(conn mllp.ConnInfo) {
	return func(conn mllp.ConnInfo) {
		remote := ""
		if conn.RemoteAddr != nil {
			remote = conn.RemoteAddr.String()
		}
		in.Logger.Warn("closing connection: too many unparseable frames in a row",
			"channel", channel, "remote", remote, "max_unparseable_in_a_row", limit)
		in.Metrics.ConnectionClosed(channel, metrics.CloseUnparseableInARow)
	}
}

// OversizeACK answers a frame larger than channel allows.
func (in *Intake) OversizeACK(channel string, limit int) func(prefix []byte) []byte {
	return func(prefix []byte) []byte {
		in.Logger.Warn("rejected oversize frame", "channel", channel, "limit_bytes", limit)
		in.Metrics.Rejected(channel, metrics.RejectOversize)
		return hl7.NewACKForUnparsed(prefix, hl7.AckReject,
			fmt.Sprintf("message larger than the %d-byte limit of this listener", limit), hl7.NewControlID(), in.now())
	}
}

func (in *Intake) now() time.Time {
	if in.Now != nil {
		return in.Now()
	}
	return time.Now()
}
