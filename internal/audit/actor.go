package audit

import "context"

type actorKey struct{}

// WithActor returns ctx carrying the mefor user acting through it: every
// entry appended with that ctx and no Actor of its own names them. The API
// sets it per request, so package ops's audited reads name the person
// without each of them taking a user.
func WithActor(ctx context.Context, name string) context.Context {
	return context.WithValue(ctx, actorKey{}, name)
}

// ActorOf is the mefor user WithActor put in ctx, or "".
func ActorOf(ctx context.Context) string {
	name, _ := ctx.Value(actorKey{}).(string)
	return name
}
