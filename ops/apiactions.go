package ops

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/mefor/mefor/internal/api"
	"github.com/mefor/mefor/internal/crypt"
	"github.com/mefor/mefor/internal/pipeline"
	"github.com/mefor/mefor/internal/search"
)

var _ api.Actions = APIActions{}

// APIActions is what the API's action endpoints call (api.Actions): the
// functions the CLI's replay, replay-dead, cancel and stepdown call, over
// the node's pool.
type APIActions struct {
	Pool *pgxpool.Pool
	// CancelWait is how long a cancel waits for rows a drainer may be
	// sending. Defaults to 10s (the CLI's --wait is 30s; an HTTP answer
	// should not wait as long).
	CancelWait time.Duration
	// StepdownTimeout bounds the wait for a stepdown's answer. Defaults to
	// 15s.
	StepdownTimeout time.Duration
	// Keys is the node's keyring, which a key rotation re-seals under.
	// Defaults to none: a rotation answers api.ErrNoKeys.
	Keys *crypt.Keyring
}

// MessageChannel is search.MessageChannel.
func (a APIActions) MessageChannel(ctx context.Context, id int64) (string, error) {
	return search.MessageChannel(ctx, a.Pool, id)
}

// Replay is Replay.
func (a APIActions) Replay(ctx context.Context, id int64) (any, error) {
	return Replay(ctx, a.Pool, id)
}

// perChannel runs fn once with channel when scope is nil, else once per
// channel scope holds among those that have outbound rows of status (for
// destination), restricted to channel when it is set: a scoped person's
// bulk action never touches another channel's rows, even on a destination
// that several channels share. A channel whose first such row appears
// after the list was read is left alone, as rows arriving during a bulk
// run are.
func (a APIActions) perChannel(ctx context.Context, channel, destination, status string, scope api.Scope,
	fn func(channel string) (BulkResult, error)) (BulkResult, error) {
	if scope == nil {
		return fn(channel)
	}
	channels, err := search.OutboundChannels(ctx, a.Pool, destination, status)
	if err != nil {
		return BulkResult{}, err
	}
	var sum BulkResult
	for _, c := range channels {
		if (channel != "" && c != channel) || !scope(c) {
			continue
		}
		r, err := fn(c)
		sum.add(r)
		if err != nil {
			return sum, err
		}
	}
	return sum, nil
}

// add adds r's counts to b.
func (b *BulkResult) add(r BulkResult) {
	b.Matched += r.Matched
	b.Rows += r.Rows
	b.Skipped += r.Skipped
	b.Messages += r.Messages
	b.Delivered += r.Delivered
	b.DeliveredMessages = append(b.DeliveredMessages, r.DeliveredMessages...)
	b.Dead += r.Dead
	b.DeadMessages = append(b.DeadMessages, r.DeadMessages...)
	b.InFlight += r.InFlight
	b.InFlightMessages = append(b.InFlightMessages, r.InFlightMessages...)
}

// ReplayDead is ReplayDead, once per channel of scope.
func (a APIActions) ReplayDead(ctx context.Context, channel, destination string, scope api.Scope) (any, error) {
	return a.perChannel(ctx, channel, destination, pipeline.WorkDead, scope, func(c string) (BulkResult, error) {
		return ReplayDead(ctx, a.Pool, pipeline.DeadFilter{Channel: c, Destination: destination}, BulkOptions{})
	})
}

// Cancel is Cancel, once per channel of scope.
func (a APIActions) Cancel(ctx context.Context, destination, channel string, top bool, wait time.Duration, scope api.Scope) (any, error) {
	if destination == "" {
		return nil, ErrNoDestination
	}
	if wait <= 0 {
		wait = a.CancelWait
	}
	if wait <= 0 {
		wait = 10 * time.Second
	}
	return a.perChannel(ctx, channel, destination, pipeline.WorkPending, scope, func(c string) (BulkResult, error) {
		return Cancel(ctx, a.Pool, pipeline.CancelFilter{Destination: destination, Channel: c, Top: top}, BulkOptions{Wait: wait})
	})
}

// RotateKeys is RotateKeys with the node's keyring.
func (a APIActions) RotateKeys(ctx context.Context) (any, error) {
	if !a.Keys.Enabled() {
		return nil, api.ErrNoKeys
	}
	return RotateKeys(ctx, a.Pool, a.Keys, RotateOptions{})
}

// Stepdown is RequestStepdown.
func (a APIActions) Stepdown(ctx context.Context, node string, timeout time.Duration) (any, error) {
	if timeout <= 0 {
		timeout = a.StepdownTimeout
	}
	if timeout <= 0 {
		timeout = 15 * time.Second
	}
	return RequestStepdown(ctx, a.Pool, StepdownRequest{Node: node, Timeout: timeout})
}
