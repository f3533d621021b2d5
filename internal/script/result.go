package script

import (
	"fmt"
	"slices"
	"strings"

	"github.com/dop251/goja"

	"github.com/mefor/mefor/internal/hl7"
)

// resultHelp is what a transform may return, for errors.
const resultHelp = "return nothing (deliver msg), null (filter it out), a message, " +
	"or an array of messages and {message, destinations: [...]} objects"

// result turns what transform returned into outputs: undefined delivers
// msg (with the script's changes), null filters the message out, a message
// delivers that message, an array delivers each element in order.
func (rt *runtime) result(ret goja.Value, msg *hl7.Message, in Input) ([]Output, error) {
	switch {
	case ret == nil || goja.IsUndefined(ret):
		return []Output{{Message: msg}}, nil
	case goja.IsNull(ret):
		return nil, nil
	}
	o, ok := ret.(*goja.Object)
	if !ok {
		return nil, rt.badResult("transform returned a %s; %s", typeOf(ret), resultHelp)
	}
	if o.ClassName() != "Array" {
		out, err := rt.element(o, in, "the result")
		if err != nil {
			return nil, err
		}
		return []Output{out}, nil
	}
	n := int(o.Get("length").ToInteger())
	outs := make([]Output, 0, n)
	for i := range n {
		v := o.Get(fmt.Sprint(i))
		what := fmt.Sprintf("element %d of the returned array", i)
		eo, ok := v.(*goja.Object)
		if !ok {
			return nil, rt.badResult("%s is a %s; %s", what, typeOf(v), resultHelp)
		}
		out, err := rt.element(eo, in, what)
		if err != nil {
			return nil, err
		}
		outs = append(outs, out)
	}
	return outs, nil
}

// element reads one returned message or {message, destinations}.
func (rt *runtime) element(o *goja.Object, in Input, what string) (Output, error) {
	if m, ok := rt.msgs[o]; ok {
		return Output{Message: m}, nil
	}
	mv := o.Get("message")
	if mv == nil || goja.IsUndefined(mv) {
		return Output{}, rt.badResult("%s is a %s, not a message or {message, destinations}; %s", what, typeOf(o), resultHelp)
	}
	mo, _ := mv.(*goja.Object)
	m, ok := rt.msgs[mo]
	if !ok {
		return Output{}, rt.badResult("%s: message is a %s, not a message of this transform (msg or msg.clone())", what, typeOf(mv))
	}
	out := Output{Message: m}
	dv := o.Get("destinations")
	if dv == nil || goja.IsUndefined(dv) || goja.IsNull(dv) {
		return out, nil
	}
	do, ok := dv.(*goja.Object)
	if !ok || do.ClassName() != "Array" {
		return Output{}, rt.badResult("%s: destinations is a %s; give an array of destination names", what, typeOf(dv))
	}
	out.Destinations = []string{}
	n := int(do.Get("length").ToInteger())
	for i := range n {
		d, ok := do.Get(fmt.Sprint(i)).Export().(string)
		if !ok {
			return Output{}, rt.badResult("%s: destinations[%d] is not a string", what, i)
		}
		if !slices.Contains(in.Destinations, d) {
			return Output{}, rt.badResult("%s: destination %q is not one of route %q's destinations (%s)",
				what, d, in.Route, strings.Join(in.Destinations, ", "))
		}
		if !slices.Contains(out.Destinations, d) {
			out.Destinations = append(out.Destinations, d)
		}
	}
	return out, nil
}

func (rt *runtime) badResult(format string, args ...any) error {
	return &Error{Handler: rt.p.name, Kind: KindResult, Message: fmt.Sprintf(format, args...)}
}
