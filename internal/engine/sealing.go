package engine

import (
	"context"

	"github.com/mefor/mefor/internal/pipeline"
)

// checkSealedStore makes the node's keyring refuse content that is not
// sealed bound to its row (plaintext, the legacy mfe1 envelope) once
// `mefor keys rotate` has marked the store sealed (pipeline.SealedStore),
// or at start when the store holds no content yet (a new store has no
// plaintext to accept). Before that the node reads such values: the
// migration step of turning encryption on. It runs at start and every
// heartbeat with the config watch, and stops looking once the store is
// sealed (a store is not unsealed while nodes run), so it costs nothing
// after that.
func (n *Node) checkSealedStore(ctx context.Context, starting bool) error {
	kr := n.opts.Keys
	if !kr.Enabled() || kr.RefusesUnbound() {
		return nil
	}
	read := pipeline.SealedStore
	if starting {
		read = func(ctx context.Context, q pipeline.DBTX) (bool, error) {
			return pipeline.MarkSealedStoreIfEmpty(ctx, q, kr.ActiveID())
		}
	}
	sealed, err := read(ctx, n.opts.Pool)
	if err != nil || !sealed {
		return err
	}
	kr.RefuseUnbound(true)
	n.logger.InfoContext(ctx, "the store is sealed: content that is plaintext or not bound to its row is refused as tampered")
	return nil
}
