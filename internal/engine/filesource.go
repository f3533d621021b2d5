package engine

import (
	"context"
	"slices"

	"github.com/mefor/mefor/internal/config"
	"github.com/mefor/mefor/internal/filesource"
)

// A channel's directory is polled, like a listener is bound, only while
// the node holds the listener lease: the pollers start and stop with the
// listeners (bindLocked, unbindLocked), so a shared directory is read by
// one node at a time and a node that loses the lease stops at once.

// filePoller is one channel's running poller.
type filePoller struct {
	channel string
	in      config.FileInbound // the settings it runs with
	stop    context.CancelFunc
	done    chan struct{}
}

// startPollersLocked starts a poller for every file channel of cfg that
// has none. Callers hold n.mu.
func (n *Node) startPollersLocked(ctx context.Context, cfg *config.Config) error {
	for i := range cfg.Channels {
		ch := &cfg.Channels[i]
		if ch.Inbound.File == nil || slices.ContainsFunc(n.pollers, func(fp *filePoller) bool { return fp.channel == ch.Name }) {
			continue
		}
		p, err := filesource.New(filesource.Config{Channel: ch.Name, Inbound: ch.Inbound.File, Store: n.intake,
			Serving: n.lease.Serving, Logger: n.logger})
		if err != nil {
			return err
		}
		pctx, stop := context.WithCancel(context.WithoutCancel(ctx))
		fp := &filePoller{channel: ch.Name, in: *ch.Inbound.File, stop: stop, done: make(chan struct{})}
		go func() { defer close(fp.done); p.Run(pctx) }()
		n.pollers = append(n.pollers, fp)
		n.logger.InfoContext(ctx, "polling", "channel", ch.Name, "directory", ch.Inbound.File.Directory)
	}
	return nil
}

// stopPollersLocked stops every poller and waits for it: a file being
// stored is abandoned (its transaction rolls back, or committed and the
// file is skipped at the next poll). Callers hold n.mu.
func (n *Node) stopPollersLocked(ctx context.Context) {
	for _, fp := range n.pollers {
		fp.stop()
		<-fp.done
		n.logger.InfoContext(ctx, "stopped polling", "channel", fp.channel)
	}
	n.pollers = nil
}

// swapPollersLocked brings a polling node's pollers in line with next,
// after a reload: a poller whose settings changed or whose channel left is
// stopped, new ones started. It returns the channels whose poller changed.
// Callers hold n.mu.
func (n *Node) swapPollersLocked(ctx context.Context, next *config.Config) []string {
	if !n.bound {
		return nil
	}
	var changed []string
	kept := n.pollers[:0]
	for _, fp := range n.pollers {
		ch := next.Channel(fp.channel)
		if ch != nil && ch.Inbound.File != nil && *ch.Inbound.File == fp.in {
			kept = append(kept, fp)
			continue
		}
		fp.stop()
		<-fp.done
		n.logger.InfoContext(ctx, "stopped polling", "channel", fp.channel)
		changed = append(changed, fp.channel)
	}
	n.pollers = kept
	before := len(n.pollers)
	if err := n.startPollersLocked(ctx, next); err != nil {
		n.logger.ErrorContext(ctx, "a file channel is not polled after the reload; reload again or restart", "error", err)
	}
	for _, fp := range n.pollers[before:] {
		if !slices.Contains(changed, fp.channel) {
			changed = append(changed, fp.channel)
		}
	}
	return changed
}

// PolledChannels lists the file channels whose directory this node polls
// now: all of them while it holds the listener lease, none otherwise.
func (n *Node) PolledChannels() []string {
	n.mu.Lock()
	defer n.mu.Unlock()
	var out []string
	for _, fp := range n.pollers {
		out = append(out, fp.channel)
	}
	return out
}
