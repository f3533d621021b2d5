// Package handler holds the handlers that turn a routed inbound message into
// the message to deliver.
package handler

import (
	"context"

	"github.com/mefor/mefor/internal/hl7"
)

// Handler transforms a routed message. A nil result with a nil error means
// the handler filtered the message out and nothing is delivered.
//
// Handle must not modify msg: the caller may still need the message as it
// arrived (to acknowledge it, to retry, to hand it to another route). A
// handler that changes the message works on msg.Clone().
//
// Errors must not quote message content; name paths and positions instead.
type Handler interface {
	Handle(ctx context.Context, msg *hl7.Message) (*hl7.Message, error)
}

// HandlerFunc adapts a function to Handler.
type HandlerFunc func(ctx context.Context, msg *hl7.Message) (*hl7.Message, error)

// Handle calls f.
func (f HandlerFunc) Handle(ctx context.Context, msg *hl7.Message) (*hl7.Message, error) {
	return f(ctx, msg)
}

// Passthrough delivers the message unchanged. It returns msg itself, not a
// copy, which is safe because handlers and their callers do not modify
// messages they did not create.
type Passthrough struct{}

// Handle returns msg.
func (Passthrough) Handle(_ context.Context, msg *hl7.Message) (*hl7.Message, error) {
	return msg, nil
}
