package engine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/mefor/mefor/internal/config"
	"github.com/mefor/mefor/internal/handler"
	"github.com/mefor/mefor/internal/hl7"
	"github.com/mefor/mefor/internal/reference"
	"github.com/mefor/mefor/internal/script"
	"github.com/mefor/mefor/internal/state"
)

// DryRun runs one handler on sample messages the way the transform stage
// would, without a database: reference sets are read from their CSV files
// and transform state lives in memory, seeded by the caller. Messages run
// in order against one state, as they would in one lane, so a later sample
// sees an earlier one's writes. It is what `mefor handler test` runs.
type DryRun struct {
	cfg     *config.Config
	name    string
	channel string
	route   *config.Route
	script  *script.Program
	handler handler.Handler
	batch   *state.Batch
	// current is the state as the samples so far left it, to show what a
	// write replaced.
	current map[state.Key]json.RawMessage
	nextID  int64
	// Warnings say what the dry run cannot do like a node would.
	Warnings []string
}

// DryRunOptions configure NewDryRun.
type DryRunOptions struct {
	// Route is "channel/route" to run the handler as; empty means the first
	// route that uses the handler.
	Route string
	// State seeds transform state.
	State map[state.Key]json.RawMessage
}

// NewDryRun prepares handler name of cfg.
func NewDryRun(ctx context.Context, cfg *config.Config, name string, opts DryRunOptions) (*DryRun, error) {
	h := cfg.Handler(name)
	if h == nil {
		var names []string
		for _, h := range cfg.Handlers {
			names = append(names, h.Name)
		}
		return nil, fmt.Errorf("handler %q is not in %s (handlers: %s)", name, cfg.File, strings.Join(append(names, "passthrough"), ", "))
	}
	d := &DryRun{cfg: cfg, name: name, current: map[state.Key]json.RawMessage{}, nextID: 1}
	if err := d.pickRoute(opts.Route); err != nil {
		return nil, err
	}
	seed := state.Map{}
	for k, v := range opts.State {
		seed[k] = state.Entry{Value: v, Version: 1}
		d.current[k] = v
	}
	d.batch = state.NewBatch(seed)

	lookup := d.readReferenceSets(ctx)
	opt := []handler.MapOption{handler.WithLookup(lookup)}
	switch h.Type {
	case config.HandlerJavaScript:
		p, err := buildScript(cfg, *h, opt)
		if err != nil {
			return nil, err
		}
		d.script = p
	default:
		built, err := buildHandler(*h, opt)
		if err != nil {
			return nil, fmt.Errorf("handler %q: %w", name, err)
		}
		d.handler = built
	}
	return d, nil
}

func (d *DryRun) pickRoute(want string) error {
	var all []string
	for i := range d.cfg.Channels {
		ch := &d.cfg.Channels[i]
		for j := range ch.Routes {
			r := &ch.Routes[j]
			id := ch.Name + "/" + r.Name
			all = append(all, id)
			if (want == "" && r.Handler == d.name && d.route == nil) || want == id {
				d.channel, d.route = ch.Name, r
			}
		}
	}
	switch {
	case d.route != nil:
		if d.route.Handler != d.name {
			d.Warnings = append(d.Warnings, fmt.Sprintf("route %s uses handler %q, not %q; running %q with its destinations", want, d.route.Handler, d.name, d.name))
		}
		return nil
	case want != "":
		return fmt.Errorf("route %q is not in %s (routes: %s)", want, d.cfg.File, strings.Join(all, ", "))
	}
	d.route = &config.Route{Name: "(none)"}
	d.Warnings = append(d.Warnings, fmt.Sprintf("no route uses handler %q: outputs have no destinations", d.name))
	return nil
}

// Route names the channel and route the handler runs as, and their
// destinations.
func (d *DryRun) Route() (channel, route string, destinations []string) {
	return d.channel, d.route.Name, slices.Clone(d.route.Destinations)
}

// readReferenceSets loads the config's CSV reference sets from their files;
// a lookup in any other set fails, saying why.
func (d *DryRun) readReferenceSets(ctx context.Context) handler.Lookup {
	l := dryLookup{sets: map[string]dryLookupSet{}}
	for i := range d.cfg.ReferenceSets {
		set := &d.cfg.ReferenceSets[i]
		if set.Source.CSV == nil {
			l.sets[set.Name] = dryLookupSet{err: fmt.Errorf("reference set %q reads %s; a dry run reads only CSV sets", set.Name, set.Source.Kind())}
			d.Warnings = append(d.Warnings, fmt.Sprintf("reference set %q is not read (a %s source); its lookups fail", set.Name, set.Source.Kind()))
			continue
		}
		rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		snap, err := reference.Read(rctx, set, reference.Egress{}) // a CSV file: nothing to reach
		cancel()
		if err != nil {
			l.sets[set.Name] = dryLookupSet{err: fmt.Errorf("reference set %q: %w", set.Name, err)}
			d.Warnings = append(d.Warnings, fmt.Sprintf("reference set %q could not be read, its lookups fail: %v", set.Name, err))
			continue
		}
		s := dryLookupSet{columns: snap.Columns, rows: map[string][]string{}}
		for _, r := range snap.Rows {
			s.rows[r.Key] = r.Values
		}
		l.sets[set.Name] = s
	}
	return l
}

// DryResult is what the handler did with one sample.
type DryResult struct {
	// Outputs are the messages to deliver, in order; none means the
	// message was filtered out (or failed).
	Outputs []DryOutput
	// Writes are the state writes the transform made, with the values
	// they replace (nil: absent).
	Writes []DryWrite
	// Logs are the script's ctx.log lines.
	Logs []DryLog
	// Err is why the transform failed; Held says a node would hold the
	// lane at this message (on_error: hold, or a set without data) rather
	// than dead-letter it.
	Err  error
	Held bool
}

// DryOutput is one message and the destinations it goes to.
type DryOutput struct {
	Message      *hl7.Message
	Destinations []string
}

// DryWrite is one state write; Value nil is a delete.
type DryWrite struct {
	Key      state.Key
	Value    json.RawMessage
	Previous json.RawMessage
}

// DryLog is one ctx.log line.
type DryLog struct {
	Level slog.Level
	Text  string
}

// Run transforms one sample. A failure is reported in the result; the
// samples after it still run, against the state before it.
func (d *DryRun) Run(ctx context.Context, msg *hl7.Message) DryResult {
	var res DryResult
	id := d.nextID
	d.nextID++
	row := d.batch.Row()
	if d.script == nil {
		out, err := d.handler.Handle(ctx, msg)
		res.Err = err
		if err == nil && out != nil {
			res.Outputs = []DryOutput{{Message: out, Destinations: slices.Clone(d.route.Destinations)}}
		}
	} else {
		outs, err := d.script.Run(ctx, script.Input{
			Message: msg, MessageID: id, Channel: d.channel, Route: d.route.Name,
			Destinations: d.route.Destinations, State: row,
			Log: func(level slog.Level, text string) { res.Logs = append(res.Logs, DryLog{level, text}) },
		})
		res.Err = err
		for _, o := range outs {
			dests := o.Destinations
			if dests == nil {
				dests = slices.Clone(d.route.Destinations)
			}
			res.Outputs = append(res.Outputs, DryOutput{Message: o.Message, Destinations: dests})
		}
	}
	if res.Err != nil {
		res.Held = errors.Is(res.Err, handler.ErrNotReady)
		res.Outputs = nil
		row.Discard()
		return res
	}
	for _, w := range row.Commit().Writes {
		res.Writes = append(res.Writes, DryWrite{Key: w.Key, Value: w.Value, Previous: d.current[w.Key]})
		if w.Value == nil {
			delete(d.current, w.Key)
		} else {
			d.current[w.Key] = w.Value
		}
	}
	return res
}

type dryLookup struct{ sets map[string]dryLookupSet }

type dryLookupSet struct {
	columns []string
	rows    map[string][]string
	err     error
}

func (l dryLookup) Lookup(set, key, column string) (string, bool, error) {
	s, ok := l.sets[set]
	if !ok {
		return "", false, fmt.Errorf("reference set %q is not declared under reference_sets", set)
	}
	if s.err != nil {
		return "", false, s.err
	}
	i := 0
	if column != "" {
		if i = slices.Index(s.columns, column); i < 0 {
			return "", false, fmt.Errorf("reference set %q has no column %q (columns: %s)", set, column, strings.Join(s.columns, ", "))
		}
	}
	row, ok := s.rows[key]
	if !ok {
		return "", false, nil
	}
	return row[i], true, nil
}
