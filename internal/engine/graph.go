package engine

import (
	"context"
	"fmt"
	"hash/fnv"

	"github.com/mefor/mefor/internal/config"
	"github.com/mefor/mefor/internal/drainer"
	"github.com/mefor/mefor/internal/handler"
	"github.com/mefor/mefor/internal/hl7"
	"github.com/mefor/mefor/internal/script"
	"github.com/mefor/mefor/internal/state"
	"github.com/mefor/mefor/jobs"
	"github.com/mefor/mefor/workers"
)

// Graph is a config compiled for the pipeline: handlers built, partition
// keys parsed, each destination's lane layout numbered. It is immutable; a
// reload builds a new one.
type Graph struct {
	cfg      *config.Config
	handlers map[string]handler.Handler
	scripts  map[string]*script.Program // javascript handlers
	keys     map[string]hl7.Path        // partitioned destination → key path
	// gens is each destination's layout generation (store.ResolveLayouts);
	// a destination missing from it uses generation 0.
	gens map[string]int
}

// NewGraph compiles cfg with every destination at layout generation 0, for
// tools and tests; a node uses NewGraphWith. opts reach every map handler;
// lookups need handler.WithLookup (a node passes its reference cache).
func NewGraph(cfg *config.Config, opts ...handler.MapOption) (*Graph, error) {
	return NewGraphWith(cfg, nil, opts...)
}

// NewGraphWith compiles cfg with the destinations' layout generations.
func NewGraphWith(cfg *config.Config, gens map[string]int, opts ...handler.MapOption) (*Graph, error) {
	g := &Graph{cfg: cfg, handlers: map[string]handler.Handler{}, scripts: map[string]*script.Program{},
		keys: map[string]hl7.Path{}, gens: gens}
	g.handlers["passthrough"] = handler.Passthrough{}
	for _, h := range cfg.Handlers {
		if h.Type == config.HandlerJavaScript {
			p, err := buildScript(cfg, h, opts)
			if err != nil {
				return nil, fmt.Errorf("handler %q: %w", h.Name, err)
			}
			g.scripts[h.Name] = p
			continue
		}
		built, err := buildHandler(h, opts)
		if err != nil {
			return nil, fmt.Errorf("handler %q: %w", h.Name, err)
		}
		g.handlers[h.Name] = built
	}
	for _, d := range cfg.Destinations {
		if d.Ordering.Mode != config.OrderPartitioned {
			continue
		}
		p, err := hl7.ParsePath(d.Ordering.Key)
		if err != nil {
			return nil, fmt.Errorf("destination %q: ordering.key: %w", d.Name, err)
		}
		g.keys[d.Name] = p
	}
	return g, nil
}

// Config is the config the graph was built from.
func (g *Graph) Config() *config.Config { return g.cfg }

// Route implements workers.Graph.
func (g *Graph) Route(channel string, msg *hl7.Message) ([]drainer.RoutedOut, bool) {
	ch := g.cfg.Channel(channel)
	if ch == nil {
		return nil, false
	}
	h := headerOf(msg)
	var outs []drainer.RoutedOut
	for _, r := range ch.Routes {
		if r.Match.Matches(h) {
			outs = append(outs, drainer.RoutedOut{Route: r.Name, Handler: r.Handler})
		}
	}
	return outs, true
}

// Transform implements workers.Graph: run the route's handler and lay out
// one delivery per destination of the route.
func (g *Graph) Transform(ctx context.Context, row drainer.Row, msg *hl7.Message, st *state.Row) ([]drainer.OutboundOut, error) {
	ch := g.cfg.Channel(row.Channel)
	if ch == nil {
		return nil, fmt.Errorf("channel %q is %w", row.Channel, workers.ErrNotInConfig)
	}
	route := ch.Route(row.Route)
	if route == nil {
		return nil, fmt.Errorf("route %q of channel %q is %w", row.Route, row.Channel, workers.ErrNotInConfig)
	}
	if p, ok := g.scripts[row.Handler]; ok {
		return g.transformScript(ctx, p, row, route, msg, st)
	}
	h, ok := g.handlers[row.Handler]
	if !ok {
		return nil, fmt.Errorf("handler %q is %w", row.Handler, workers.ErrNotInConfig)
	}
	out, err := h.Handle(ctx, msg)
	if err != nil {
		return nil, fmt.Errorf("handler %q: %w", row.Handler, err)
	}
	if out == nil {
		return nil, nil // filtered
	}
	payload := out.Encode()
	outs := make([]drainer.OutboundOut, 0, len(route.Destinations))
	for _, name := range route.Destinations {
		dest := g.cfg.Destination(name)
		if dest == nil {
			return nil, fmt.Errorf("destination %q is %w", name, workers.ErrNotInConfig)
		}
		outs = append(outs, drainer.OutboundOut{
			Destination: name,
			Lane:        g.laneFor(dest, out, row.MessageID),
			Payload:     payload,
		})
	}
	return outs, nil
}

// laneFor picks a destination lane: the single lane of a fifo destination,
// round-robin by message id for parallel, and by a hash of the key field for
// partitioned, so one patient's messages always share a lane.
func (g *Graph) laneFor(dest *config.Destination, msg *hl7.Message, messageID int64) string {
	n, gen := dest.Ordering.Lanes, g.gens[dest.Name]
	switch dest.Ordering.Mode {
	case config.OrderParallel:
		return jobs.OutboundLane(dest.Name, gen, n, int(messageID%int64(n)))
	case config.OrderPartitioned:
		h := fnv.New32a()
		h.Write([]byte(msg.GetPath(g.keys[dest.Name])))
		return jobs.OutboundLane(dest.Name, gen, n, int(h.Sum32()%uint32(n)))
	}
	return jobs.OutboundLane(dest.Name, gen, 1, 0)
}

// Destination implements workers.Graph.
func (g *Graph) Destination(name string) *config.Destination { return g.cfg.Destination(name) }

func headerOf(msg *hl7.Message) config.MessageHeader {
	h := msg.Header()
	return config.MessageHeader{
		MessageType:          h.MessageType,
		TriggerEvent:         h.TriggerEvent,
		SendingApplication:   h.SendingApplication,
		SendingFacility:      h.SendingFacility,
		ReceivingApplication: h.ReceivingApplication,
		ReceivingFacility:    h.ReceivingFacility,
		ProcessingID:         h.ProcessingID,
		Version:              h.Version,
	}
}

// buildHandler turns a handler's config into the handler.
func buildHandler(h config.Handler, opts []handler.MapOption) (handler.Handler, error) {
	switch h.Type {
	case config.HandlerPassthrough:
		return handler.Passthrough{}, nil
	case config.HandlerMap:
		ops := make([]handler.MapOp, 0, len(h.Map))
		for _, op := range h.Map {
			mo := handler.MapOp{Op: handler.OpKind(op.Kind), Path: op.Target, Value: op.Value, From: op.From}
			if op.Kind == config.MapLookup {
				// The config keeps a lookup's default in Value.
				mo.Value, mo.Default = "", op.Value
				mo.Set, mo.Column, mo.OnMiss = op.Set, op.Column, handler.MissPolicy(op.OnMiss)
			}
			ops = append(ops, mo)
		}
		return handler.NewMap(ops, opts...)
	}
	return nil, fmt.Errorf("unsupported handler type %q", h.Type)
}
