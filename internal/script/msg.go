package script

import (
	"fmt"
	"regexp"
	"strconv"

	"github.com/dop251/goja"

	"github.com/mefor/mefor/internal/hl7"
)

// The msg object: a message of the call, over internal/hl7. Values read are
// decoded and values written are escaped with the message's own delimiters,
// exactly as the map handler does; paths are the map handler's paths.

// segmentSpec is a segment, or one occurrence of it: "OBX", "OBX(2)".
var segmentSpec = regexp.MustCompile(`^([A-Z][A-Z0-9]{2})(?:\((\d{1,4})\))?$`)

// setup builds the prototypes and the shared ctx parts of a runtime.
func (rt *runtime) setup() {
	vm := rt.vm
	rt.msgs = map[*goja.Object]*hl7.Message{}

	mp := vm.NewObject()
	method := func(o *goja.Object, name string, fn func(call goja.FunctionCall) goja.Value) {
		_ = o.DefineDataProperty(name, vm.ToValue(fn), goja.FLAG_FALSE, goja.FLAG_FALSE, goja.FLAG_FALSE)
	}
	method(mp, "get", func(c goja.FunctionCall) goja.Value {
		m := rt.this(c)
		return vm.ToValue(m.GetPath(rt.path(c.Argument(0), "get")))
	})
	method(mp, "set", func(c goja.FunctionCall) goja.Value {
		m := rt.this(c)
		p := rt.path(c.Argument(0), "set")
		v := rt.text(c.Argument(1), "set")
		if err := m.SetPath(p, v); err != nil {
			rt.throwf("msg.set(%q): %v", p.String(), err)
		}
		return goja.Undefined()
	})
	method(mp, "remove", func(c goja.FunctionCall) goja.Value {
		m := rt.this(c)
		spec := rt.str(c.Argument(0), "remove", "a path such as PID-8, or a segment such as NTE or OBX(2)")
		if seg, occ, ok := parseSegmentSpec(spec); ok {
			n, err := m.RemoveSegments(seg, occ)
			if err != nil {
				rt.throwf("msg.remove(%q): %v", spec, err)
			}
			return vm.ToValue(n)
		}
		p := rt.path(c.Argument(0), "remove")
		if err := m.ClearPath(p); err != nil {
			rt.throwf("msg.remove(%q): %v", spec, err)
		}
		return goja.Undefined()
	})
	method(mp, "segments", func(c goja.FunctionCall) goja.Value {
		m := rt.this(c)
		name := ""
		if a := c.Argument(0); !goja.IsUndefined(a) {
			name = rt.str(a, "segments", "a segment id such as OBX")
			if seg, occ, ok := parseSegmentSpec(name); !ok || occ != 0 {
				rt.throwf("msg.segments(%q): want a segment id such as OBX, or nothing for every segment", name)
			} else {
				name = seg
			}
		}
		var out []any
		count := map[string]int{}
		for i, id := range m.SegmentIDs() {
			count[id]++
			if name == "" || id == name {
				out = append(out, rt.newSegment(m, id, count[id], i))
			}
		}
		return vm.NewArray(out...)
	})
	method(mp, "addSegment", func(c goja.FunctionCall) goja.Value {
		m := rt.this(c)
		text := rt.str(c.Argument(0), "addSegment", "the segment's text, e.g. \"ZVC|1|3\"")
		at := m.SegmentCount()
		if a := c.Argument(1); !goja.IsUndefined(a) {
			spec := rt.str(a, "addSegment", "the segment to add after, e.g. \"OBX\" (the last OBX) or \"OBX(2)\"")
			seg, occ, ok := parseSegmentSpec(spec)
			if !ok {
				rt.throwf("msg.addSegment: after %q: want a segment such as OBX (after the last one) or OBX(2)", spec)
			}
			if occ == 0 {
				occ = m.Count(seg)
			}
			i := m.SegmentIndex(seg, occ)
			if i < 0 || occ == 0 {
				rt.throwf("msg.addSegment: the message has no segment %s to add after", spec)
			}
			at = i + 1
		}
		if err := m.InsertSegment(at, text); err != nil {
			rt.throwf("msg.addSegment: %v", err)
		}
		return goja.Undefined()
	})
	method(mp, "clone", func(c goja.FunctionCall) goja.Value {
		return rt.newMsg(rt.this(c).Clone())
	})
	method(mp, "toString", func(c goja.FunctionCall) goja.Value {
		return vm.ToValue(string(rt.this(c).Encode()))
	})
	rt.msgProto = mp

	sp := vm.NewObject()
	method(sp, "get", func(c goja.FunctionCall) goja.Value {
		m, p := rt.segPath(c, "get")
		return vm.ToValue(m.GetPath(p))
	})
	method(sp, "set", func(c goja.FunctionCall) goja.Value {
		m, p := rt.segPath(c, "set")
		if err := m.SetPath(p, rt.text(c.Argument(1), "set")); err != nil {
			rt.throwf("segment.set(%q): %v", p.String(), err)
		}
		return goja.Undefined()
	})
	method(sp, "toString", func(c goja.FunctionCall) goja.Value {
		s := rt.seg(c)
		i := s.m.SegmentIndex(s.id, s.occurrence)
		return vm.ToValue(s.m.SegmentText(i))
	})
	rt.segProto = sp
	rt.segs = map[*goja.Object]*segRef{}

	rt.setupCtx()
}

// newMsg wraps m as a msg object of the current call.
func (rt *runtime) newMsg(m *hl7.Message) *goja.Object {
	o := rt.vm.NewObject()
	_ = o.SetPrototype(rt.msgProto)
	rt.msgs[o] = m
	return o
}

// this is the message a msg method was called on.
func (rt *runtime) this(c goja.FunctionCall) *hl7.Message {
	if o, ok := c.This.(*goja.Object); ok {
		if m, ok := rt.msgs[o]; ok {
			return m
		}
	}
	rt.throwf("not a message of this call: call the method on msg, a clone of it, or a message returned by msg.clone() in this same transform")
	return nil
}

// segRef is a segment object: the occurrence'th segment id of m.
type segRef struct {
	m          *hl7.Message
	id         string
	occurrence int
}

func (rt *runtime) newSegment(m *hl7.Message, id string, occurrence, index int) *goja.Object {
	o := rt.vm.NewObject()
	_ = o.SetPrototype(rt.segProto)
	_ = o.DefineDataProperty("name", rt.vm.ToValue(id), goja.FLAG_FALSE, goja.FLAG_FALSE, goja.FLAG_TRUE)
	_ = o.DefineDataProperty("occurrence", rt.vm.ToValue(occurrence), goja.FLAG_FALSE, goja.FLAG_FALSE, goja.FLAG_TRUE)
	_ = o.DefineDataProperty("index", rt.vm.ToValue(index), goja.FLAG_FALSE, goja.FLAG_FALSE, goja.FLAG_FALSE)
	rt.segs[o] = &segRef{m: m, id: id, occurrence: occurrence}
	return o
}

func (rt *runtime) seg(c goja.FunctionCall) *segRef {
	if o, ok := c.This.(*goja.Object); ok {
		if s, ok := rt.segs[o]; ok {
			return s
		}
	}
	rt.throwf("not a segment of this call: call get/set on an element of msg.segments()")
	return nil
}

// segPath resolves a path relative to a segment, such as "5" or "3[2].1",
// or a field number.
func (rt *runtime) segPath(c goja.FunctionCall, method string) (*hl7.Message, hl7.Path) {
	s := rt.seg(c)
	a := c.Argument(0)
	var rel string
	switch v := a.Export().(type) {
	case int64:
		rel = strconv.FormatInt(v, 10)
	case float64:
		rel = strconv.FormatFloat(v, 'f', -1, 64)
	case string:
		rel = v
	default:
		rt.throwf("segment.%s: want a field such as 5, \"5.1\" or \"3[2].1\", got %s", method, typeOf(a))
	}
	full := s.id + "(" + strconv.Itoa(s.occurrence) + ")-" + rel
	p, err := hl7.ParsePath(full)
	if err != nil {
		rt.throwf("segment.%s(%q): %v", method, rel, err)
	}
	return s.m, p
}

// path parses a path argument, caching parsed paths per runtime.
func (rt *runtime) path(a goja.Value, method string) hl7.Path {
	s := rt.str(a, method, "a path such as PID-3.1, OBX(2)-5 or PID-3[2].1")
	if p, ok := rt.paths[s]; ok {
		return p
	}
	p, err := hl7.ParsePath(s)
	if err != nil {
		rt.throwf("msg.%s: %v", method, err)
	}
	if len(rt.paths) < 4096 {
		rt.paths[s] = p
	}
	return p
}

// str is a string argument, named in the error when it is not one.
func (rt *runtime) str(a goja.Value, method, want string) string {
	if s, ok := a.Export().(string); ok {
		return s
	}
	rt.throwf("%s: want %s, got %s", method, want, typeOf(a))
	return ""
}

// text is a value to write: a string, or a number or boolean written as
// JavaScript prints it.
func (rt *runtime) text(a goja.Value, method string) string {
	switch a.Export().(type) {
	case string, int64, float64, bool:
		return a.String()
	}
	rt.throwf("msg.%s: the value must be a string, number or boolean, got %s; to empty an element use msg.remove(path), for the HL7 null write '\"\"'", method, typeOf(a))
	return ""
}

// throwf throws a TypeError in the script. Messages name paths and
// arguments the script wrote, never message values.
func (rt *runtime) throwf(format string, args ...any) {
	panic(rt.vm.NewTypeError(fmt.Sprintf(format, args...)))
}

// parseSegmentSpec reads "OBX" (occurrence 0: every one) or "OBX(2)".
func parseSegmentSpec(s string) (seg string, occurrence int, ok bool) {
	m := segmentSpec.FindStringSubmatch(s)
	if m == nil {
		return "", 0, false
	}
	if m[2] != "" {
		n, _ := strconv.Atoi(m[2])
		if n < 1 {
			return "", 0, false
		}
		occurrence = n
	}
	return m[1], occurrence, true
}
