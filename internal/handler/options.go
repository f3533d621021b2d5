package handler

import "log/slog"

// WithLogger gives handlers that log (a javascript handler's ctx.log) the
// node's logger.
func WithLogger(l *slog.Logger) MapOption {
	return func(o *mapOptions) { o.logger = l }
}

// Env is what the options give handlers built outside this package, such
// as javascript handlers (package script).
type Env struct {
	Lookup Lookup
	Logger *slog.Logger
}

// EnvOf applies opts and returns what they set.
func EnvOf(opts ...MapOption) Env {
	var o mapOptions
	for _, opt := range opts {
		opt(&o)
	}
	return Env{Lookup: o.lookup, Logger: o.logger}
}
