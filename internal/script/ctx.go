package script

import (
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"

	"github.com/dop251/goja"

	"github.com/mefor/mefor/internal/handler"
	"github.com/mefor/mefor/internal/state"
)

// The ctx object: what a transform may use besides its message. ctx.state,
// ctx.log and ctx.lookup are built once per runtime and frozen, and read
// the call being served from the runtime; the rest is made per call.

// maxLogLine bounds one ctx.log line.
const maxLogLine = 2000

func (rt *runtime) setupCtx() {
	vm := rt.vm
	fn := func(f func(c goja.FunctionCall) goja.Value) goja.Value { return vm.ToValue(f) }

	st := vm.NewObject()
	_ = st.Set("get", fn(func(c goja.FunctionCall) goja.Value {
		row := rt.stateRow("get")
		ns, key := rt.stateKey(c, "get")
		v, ok, err := row.Get(ns, key)
		if err != nil {
			rt.throwf("ctx.state.get: %v", err)
		}
		if !ok {
			return goja.Null()
		}
		out, jerr := rt.parse(goja.Undefined(), vm.ToValue(string(v)))
		if jerr != nil {
			rt.throwf("ctx.state.get: the stored value is not valid JSON")
		}
		return out
	}))
	_ = st.Set("set", fn(func(c goja.FunctionCall) goja.Value {
		row := rt.stateRow("set")
		ns, key := rt.stateKey(c, "set")
		v := c.Argument(2)
		if goja.IsUndefined(v) {
			rt.throwf("ctx.state.set: the value is undefined; use ctx.state.delete(namespace, key) to remove a key")
		}
		js, err := rt.stringify(goja.Undefined(), v)
		if err != nil {
			panic(err) // a cycle or a BigInt: JSON.stringify's own TypeError
		}
		if goja.IsUndefined(js) {
			rt.throwf("ctx.state.set: a %s cannot be stored; values are JSON: objects, arrays, strings, numbers, booleans, null", typeOf(v))
		}
		if err := row.Set(ns, key, json.RawMessage(js.String())); err != nil {
			rt.throwf("ctx.state.set: %v", err)
		}
		return goja.Undefined()
	}))
	_ = st.Set("delete", fn(func(c goja.FunctionCall) goja.Value {
		row := rt.stateRow("delete")
		ns, key := rt.stateKey(c, "delete")
		if err := row.Delete(ns, key); err != nil {
			rt.throwf("ctx.state.delete: %v", err)
		}
		return goja.Undefined()
	}))
	rt.stateObj = rt.freeze(st)

	lg := vm.NewObject()
	_ = lg.Set("info", fn(func(c goja.FunctionCall) goja.Value { rt.log(slog.LevelInfo, c); return goja.Undefined() }))
	_ = lg.Set("warn", fn(func(c goja.FunctionCall) goja.Value { rt.log(slog.LevelWarn, c); return goja.Undefined() }))
	rt.logObj = rt.freeze(lg)

	rt.lookupFn = fn(func(c goja.FunctionCall) goja.Value {
		set := rt.str(c.Argument(0), "ctx.lookup", "a reference set name")
		key := rt.text(c.Argument(1), "lookup")
		column := ""
		if a := c.Argument(2); !goja.IsUndefined(a) {
			column = rt.str(a, "ctx.lookup", "a column name")
		}
		if !rt.p.sets[set] {
			rt.throwf("ctx.lookup: reference set %q is not declared under reference_sets", set)
		}
		if rt.p.lookup == nil {
			rt.throwf("ctx.lookup: no reference sets are available here")
		}
		if key == "" {
			return goja.Null()
		}
		v, found, err := rt.p.lookup.Lookup(set, key, column)
		if errors.Is(err, handler.ErrNotReady) {
			// Not the message's fault: the lane waits for the snapshot,
			// whatever the script does with the exception.
			rt.cur.err = &Error{Handler: rt.p.name, Kind: KindException, notReady: true, cause: err,
				Message: fmt.Sprintf("ctx.lookup: %v", err)}
			rt.throwf("ctx.lookup: %v", err)
		}
		if err != nil {
			rt.throwf("ctx.lookup: %v", err)
		}
		if !found {
			return goja.Null()
		}
		return vm.ToValue(v)
	})
}

// freeze makes a shared object immutable, so one message's script cannot
// change what the next one is given.
func (rt *runtime) freeze(o *goja.Object) *goja.Object {
	freeze, _ := goja.AssertFunction(rt.vm.Get("Object").ToObject(rt.vm).Get("freeze"))
	_, _ = freeze(goja.Undefined(), o)
	return o
}

// newCtx is the ctx argument of one call.
func (rt *runtime) newCtx(in Input) *goja.Object {
	vm := rt.vm
	o := vm.NewObject()
	ro := func(name string, v any) {
		_ = o.DefineDataProperty(name, vm.ToValue(v), goja.FLAG_FALSE, goja.FLAG_FALSE, goja.FLAG_TRUE)
	}
	ro("messageId", in.MessageID)
	ro("channel", in.Channel)
	ro("route", in.Route)
	dests := make([]any, len(in.Destinations))
	for i, d := range in.Destinations {
		dests[i] = d
	}
	ro("destinations", rt.freeze(vm.NewArray(dests...)))
	ro("state", rt.stateObj)
	ro("log", rt.logObj)
	ro("lookup", rt.lookupFn)
	return o
}

func (rt *runtime) stateRow(method string) *state.Row {
	if rt.cur == nil || rt.cur.in.State == nil {
		rt.throwf("ctx.state.%s: transform state is not available here", method)
	}
	return rt.cur.in.State
}

func (rt *runtime) stateKey(c goja.FunctionCall, method string) (ns, key string) {
	ns = rt.str(c.Argument(0), "ctx.state."+method, "a namespace string")
	key = rt.text(c.Argument(1), "state."+method)
	return ns, key
}

// log writes one ctx.log line. The arguments are joined with spaces,
// objects as JSON, when the line goes to a dry run (Input.Log) or the
// handler sets log_content. Otherwise the node's log gets a fixed message
// and each argument's type and size only: a script can put anything in its
// arguments, and the node's log is no place for message content.
func (rt *runtime) log(level slog.Level, c goja.FunctionCall) {
	in := rt.cur.in
	if in.Log == nil && !rt.p.logContent {
		shapes := make([]string, len(c.Arguments))
		for i, a := range c.Arguments {
			shapes[i] = rt.shape(a)
		}
		rt.p.logger.Log(rt.cur.ctx, level, "script: ctx.log (content not logged; log_content is off)",
			"handler", rt.p.name, "message_id", in.MessageID, "channel", in.Channel, "route", in.Route,
			"args", shapes)
		return
	}
	var b strings.Builder
	for i, a := range c.Arguments {
		if i > 0 {
			b.WriteByte(' ')
		}
		if o, ok := a.(*goja.Object); ok {
			if _, isFn := goja.AssertFunction(o); !isFn {
				if js, err := rt.stringify(goja.Undefined(), o); err == nil && !goja.IsUndefined(js) {
					b.WriteString(js.String())
					continue
				}
			}
		}
		b.WriteString(a.String())
		if b.Len() > maxLogLine {
			break
		}
	}
	text := b.String()
	if len(text) > maxLogLine {
		text = text[:maxLogLine] + "…"
	}
	if in.Log != nil {
		in.Log(level, text)
		return
	}
	rt.p.logger.Log(rt.cur.ctx, level, "script: "+text,
		"handler", rt.p.name, "message_id", in.MessageID, "channel", in.Channel, "route", in.Route)
}

// shape describes a ctx.log argument without its value: its type, and the
// length of a string or an array or the number of an object's keys. A
// number or a boolean may be content too (an age, a result), so neither is
// shown.
func (rt *runtime) shape(v goja.Value) string {
	t := typeOf(v)
	switch t {
	case "string":
		return fmt.Sprintf("string(%d)", len(v.String()))
	case "array":
		return fmt.Sprintf("array(%d)", v.(*goja.Object).Get("length").ToInteger())
	case "object":
		if o, ok := v.(*goja.Object); ok {
			return fmt.Sprintf("object(%d keys)", len(o.Keys()))
		}
	}
	return t
}
