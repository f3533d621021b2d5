package audit

import "context"

type originKey struct{}

// Origin is who acts through a request of the API, and how they reached
// it: every entry appended with a ctx carrying it names them.
type Origin struct {
	// Actor is the mefor user.
	Actor string
	// Source is the client's address.
	Source string
	// SessionID or TokenID is how the request authenticated.
	SessionID int64
	TokenID   int64
	// ApprovalID and RequestedBy are set when an approved action runs:
	// the approval and the person who asked for it (Actor approved it).
	ApprovalID  int64
	RequestedBy string
}

// fields are the origin's entries in an audit row's target, the zero
// ones left out.
func (o Origin) fields() map[string]any {
	f := map[string]any{}
	if o.Source != "" {
		f["source"] = o.Source
	}
	if o.SessionID != 0 {
		f["session_id"] = o.SessionID
	}
	if o.TokenID != 0 {
		f["token_id"] = o.TokenID
	}
	if o.ApprovalID != 0 {
		f["approval_id"] = o.ApprovalID
	}
	if o.RequestedBy != "" {
		f["requested_by"] = o.RequestedBy
	}
	return f
}

// WithOrigin returns ctx carrying o: every entry appended with that ctx
// and no Actor of its own names o.Actor, and its target gains o's source,
// session or token id and approval, where the target does not set them.
// The API sets it per request, so package ops's audited actions and reads
// name the person without each of them taking one.
func WithOrigin(ctx context.Context, o Origin) context.Context {
	return context.WithValue(ctx, originKey{}, o)
}

// OriginOf is the origin WithOrigin put in ctx, or the zero Origin.
func OriginOf(ctx context.Context) Origin {
	o, _ := ctx.Value(originKey{}).(Origin)
	return o
}

// WithActor returns ctx carrying the mefor user acting through it, and
// nothing else of an origin.
func WithActor(ctx context.Context, name string) context.Context {
	return WithOrigin(ctx, Origin{Actor: name})
}

// ActorOf is the mefor user WithActor or WithOrigin put in ctx, or "".
func ActorOf(ctx context.Context) string { return OriginOf(ctx).Actor }
