package engine

import (
	"context"
	"fmt"

	"github.com/mefor/mefor/internal/config"
	"github.com/mefor/mefor/internal/handler"
	"github.com/mefor/mefor/internal/hl7"
	"github.com/mefor/mefor/internal/pipeline"
	"github.com/mefor/mefor/internal/script"
	"github.com/mefor/mefor/internal/state"
)

// buildScript builds a javascript handler: its scripts were compiled when
// cfg was loaded; this starts its first runtime.
func buildScript(cfg *config.Config, h config.Handler, opts []handler.MapOption) (*script.Program, error) {
	env := handler.EnvOf(opts...)
	sets := make([]string, len(cfg.ReferenceSets))
	for i, s := range cfg.ReferenceSets {
		sets[i] = s.Name
	}
	return script.New(h.JavaScript, script.Options{Handler: h.Name, Lookup: env.Lookup, Sets: sets, Logger: env.Logger})
}

// transformScript runs a javascript handler and lays out its deliveries:
// each output message, in order, to the destinations it names or else to
// every destination of the route.
func (g *Graph) transformScript(ctx context.Context, p *script.Program, row pipeline.Row, route *config.Route,
	msg *hl7.Message, st *state.Row) ([]pipeline.OutboundOut, error) {
	outs, err := p.Run(ctx, script.Input{
		Message: msg, MessageID: row.MessageID, Channel: row.Channel, Route: row.Route,
		Destinations: route.Destinations, State: st,
	})
	if err != nil {
		return nil, err
	}
	var deliveries []pipeline.OutboundOut
	for _, o := range outs {
		names := o.Destinations
		if names == nil {
			names = route.Destinations
		}
		payload := o.Message.Encode()
		for _, name := range names {
			dest := g.cfg.Destination(name)
			if dest == nil {
				return nil, fmt.Errorf("destination %q is not in the config", name)
			}
			deliveries = append(deliveries, pipeline.OutboundOut{
				Destination: name,
				Lane:        g.laneFor(dest, o.Message, row.MessageID),
				Payload:     payload,
			})
		}
	}
	return deliveries, nil
}

// graphOptions are what the node's handlers get: the reference cache for
// lookups and the logger for scripts' ctx.log.
func (n *Node) graphOptions() []handler.MapOption {
	return append(n.refs.mapOptions(), handler.WithLogger(n.logger))
}
