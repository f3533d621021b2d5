// Package script runs JavaScript handlers: a script's function
// transform(msg, ctx) applied to each routed message, on the goja engine
// embedded in the node.
//
// A Program is built once per config from the scripts config.Load compiled.
// Runtimes are reused: each holds the scripts' top level already run, and
// serves one message at a time; a Program keeps a few idle ones and makes
// more when lanes run at once. A runtime is thrown away after any failure
// that could leave it half-way (a timeout, a panic inside the engine), so
// one bad message cannot poison the next.
//
// Scripts are sandboxed by what they are given: the ECMAScript built-ins, the
// msg and ctx objects, and nothing else. There is no require, no console, no
// file, network or process access, no timers. Recursion is bounded and each
// call is interrupted at the handler's timeout, or once the heap has grown
// by MaxHeapGrowth during it (limits.go). One match of a backtracking
// regular expression is abandoned after regexMatchTimeout. A script can
// still spin or allocate inside one other built-in call (a huge
// String.repeat), which is only stopped when control returns to JavaScript.
package script

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/dop251/goja"

	"github.com/mefor/mefor/internal/config"
	"github.com/mefor/mefor/internal/handler"
	"github.com/mefor/mefor/internal/hl7"
	"github.com/mefor/mefor/internal/state"
)

// Options configure a Program.
type Options struct {
	// Handler is the handler's name, for errors and logs.
	Handler string
	// Lookup answers ctx.lookup; nil makes every lookup fail.
	Lookup handler.Lookup
	// Sets are the reference sets the config declares: a lookup in any
	// other set fails its message at once instead of waiting for a
	// snapshot that will never come.
	Sets []string
	// Logger receives ctx.log lines; nil discards them.
	Logger *slog.Logger
	// Idle is how many idle runtimes are kept. Defaults to 8.
	Idle int
	// MaxHeapGrowth interrupts a call once the process's live heap has
	// grown by more than this since the call began (see limits.go).
	// Defaults to DefaultMaxHeapGrowth.
	MaxHeapGrowth uint64
}

// Program is a javascript handler ready to run. It is safe for concurrent
// use.
type Program struct {
	name    string
	scripts []config.Script
	timeout time.Duration
	hold    bool
	lookup  handler.Lookup
	sets    map[string]bool
	logger  *slog.Logger
	// logContent lets ctx.log write its arguments as they are.
	logContent bool
	maxHeap    uint64

	idle chan *runtime
}

// New builds a Program from a handler's loaded settings and starts one
// runtime, so a script whose top level fails is reported now.
func New(js *config.JavaScript, opts Options) (*Program, error) {
	if js == nil || len(js.Scripts) == 0 {
		return nil, errors.New("javascript handler has no scripts (load the config with config.Load)")
	}
	for _, s := range js.Scripts {
		if s.Program == nil {
			return nil, fmt.Errorf("script %s is not compiled (load the config with config.Load)", s.Path)
		}
	}
	if js.Timeout <= 0 {
		return nil, fmt.Errorf("javascript handler timeout must be > 0, got %s", js.Timeout)
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.Idle <= 0 {
		opts.Idle = 8
	}
	if opts.MaxHeapGrowth == 0 {
		opts.MaxHeapGrowth = DefaultMaxHeapGrowth
	}
	p := &Program{
		name: opts.Handler, scripts: js.Scripts, timeout: js.Timeout, hold: js.OnError == config.ScriptHold,
		lookup: opts.Lookup, sets: map[string]bool{}, logger: opts.Logger, logContent: js.LogContent, maxHeap: opts.MaxHeapGrowth,
		idle: make(chan *runtime, opts.Idle),
	}
	for _, s := range opts.Sets {
		p.sets[s] = true
	}
	rt, err := p.newRuntime()
	if err != nil {
		return nil, err
	}
	p.put(rt)
	return p, nil
}

// Input is one message to transform, with what ctx tells the script.
type Input struct {
	Message   *hl7.Message // read only: the script works on a copy
	MessageID int64
	Channel   string
	Route     string
	// Destinations are the route's destinations: what a plain result goes
	// to, and what a {message, destinations} result may choose from.
	Destinations []string
	// State is the row's view of transform state; nil makes ctx.state
	// fail.
	State *state.Row
	// Log, when set, receives ctx.log lines instead of the Program's
	// logger (a dry run prints them).
	Log func(level slog.Level, text string)
}

// Output is one message a transform produced.
type Output struct {
	Message *hl7.Message
	// Destinations is the subset of the route's destinations to send to;
	// nil means all of them.
	Destinations []string
}

// Run transforms one message. No outputs and no error means the script
// filtered the message out. A failure of the script is an *Error; with
// on_error: hold it also matches handler.ErrNotReady, as does a lookup in a
// reference set that has no snapshot yet. Any other error (the context
// ended) is not the message's fault either.
func (p *Program) Run(ctx context.Context, in Input) ([]Output, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if in.Message == nil {
		return nil, errors.New("javascript handler: nil message")
	}
	rt, err := p.get()
	if err != nil {
		return nil, p.fail(&Error{Handler: p.name, Kind: KindException, Message: err.Error()})
	}
	outs, err, reusable := rt.call(ctx, in)
	if reusable {
		p.put(rt)
	}
	var se *Error
	if errors.As(err, &se) {
		return nil, p.fail(se)
	}
	return outs, err
}

// fail applies the handler's on_error to a script failure.
func (p *Program) fail(e *Error) error {
	if p.hold && !e.notReady {
		e.hold = true
	}
	return e
}

func (p *Program) get() (*runtime, error) {
	select {
	case rt := <-p.idle:
		return rt, nil
	default:
		return p.newRuntime()
	}
}

func (p *Program) put(rt *runtime) {
	select {
	case p.idle <- rt:
	default: // enough idle ones: let this one go
	}
}

// Kinds of script failure.
const (
	KindException = "exception" // the script threw
	KindTimeout   = "timeout"   // interrupted at the handler's timeout
	KindResult    = "result"    // returned something that is not a message
	KindCrash     = "crash"     // the engine itself failed
	KindMemory    = "memory"    // interrupted for allocating too much
)

// Error is a failed transform. It names the handler, the kind, the
// JavaScript error (its type and the message the script gave it) and where
// it happened. The engine adds no message content to it; what a script
// puts in the errors it throws is the script author's responsibility.
type Error struct {
	Handler string
	Kind    string
	Message string
	// Where is file:line:column in the script, when known.
	Where string

	hold     bool // on_error: hold
	notReady bool // a lookup waits for a snapshot
	cause    error
}

func (e *Error) Error() string {
	s := "javascript handler " + e.Handler + ": "
	switch e.Kind {
	case KindTimeout:
		s += "timed out: " + e.Message
	case KindResult:
		s += "bad result: " + e.Message
	case KindCrash:
		s += "engine failure: " + e.Message
	default:
		s += e.Message
	}
	if e.Where != "" {
		s += " (at " + e.Where + ")"
	}
	if e.hold {
		s += " [on_error: hold]"
	}
	return s
}

// LogText is the error without the text the script gave it: a script may
// put message content in what it throws, and logs never carry content. The
// recorded error (sealed at rest like other content) keeps the whole text.
func (e *Error) LogText() string {
	s := "javascript handler " + e.Handler + ": " + e.Kind
	if e.Where != "" {
		s += " at " + e.Where
	}
	return s
}

// LogText returns err as it may be logged: a script's failure without the
// text the script gave it, any other error as it is (mefor's own errors
// never carry content).
func LogText(err error) string {
	var se *Error
	if errors.As(err, &se) {
		return se.LogText()
	}
	return err.Error()
}

// Is makes a held failure, and a lookup waiting for its reference set,
// match handler.ErrNotReady: the message is retried, not dead-lettered.
func (e *Error) Is(target error) bool {
	return target == handler.ErrNotReady && (e.hold || e.notReady)
}

func (e *Error) Unwrap() error { return e.cause }

// maxErrorText bounds the message of a recorded error.
const maxErrorText = 300

func clip(s string) string {
	if len(s) <= maxErrorText {
		return s
	}
	return strings.ToValidUTF8(s[:maxErrorText], "") + "…"
}

// runtime is one goja runtime with the scripts' top level run.
type runtime struct {
	p  *Program
	vm *goja.Runtime

	transform goja.Callable
	stringify goja.Callable
	parse     goja.Callable
	msgProto  *goja.Object
	segProto  *goja.Object
	// msgs and segs are the message and segment objects of the current
	// call; a method called on anything else throws, so an object kept in
	// a global from an earlier message cannot reach that message.
	msgs     map[*goja.Object]*hl7.Message
	segs     map[*goja.Object]*segRef
	stateObj *goja.Object
	logObj   *goja.Object
	lookupFn goja.Value
	paths    map[string]hl7.Path

	// cur is the call being served; the shared ctx functions read it.
	cur *call
}

// call is one Run on a runtime.
type call struct {
	in  Input
	ctx context.Context
	// err is an error a Go function raised that must not be reported as
	// the script's (the context ended) or that carries more than a throw
	// can (a lookup waiting for data).
	err error
}

func (p *Program) newRuntime() (rt *runtime, err error) {
	defer func() {
		if r := recover(); r != nil {
			rt, err = nil, fmt.Errorf("javascript handler %s: the engine failed starting the scripts: %v", p.name, r)
		}
	}()
	vm := goja.New()
	vm.SetMaxCallStackSize(config.MaxScriptCallDepth)
	rt = &runtime{p: p, vm: vm, paths: map[string]hl7.Path{}}
	// The built-ins the API uses (JSON, Object.freeze) are taken and the
	// API built before any script runs: a script that replaces a built-in
	// cannot change how state is stored or unfreeze what ctx shares.
	json := vm.Get("JSON").ToObject(vm)
	rt.stringify, _ = goja.AssertFunction(json.Get("stringify"))
	rt.parse, _ = goja.AssertFunction(json.Get("parse"))
	rt.setup()
	stop := rt.arm(p.timeout)
	for _, s := range p.scripts {
		if _, err := vm.RunProgram(s.Program); err != nil {
			stop()
			return nil, fmt.Errorf("javascript handler %s: %s: top level: %w", p.name, s.Path, err)
		}
	}
	stop()
	fn, ok := goja.AssertFunction(vm.Get("transform"))
	if !ok {
		return nil, fmt.Errorf("javascript handler %s: %s defines no function transform(msg, ctx)", p.name, p.scripts[len(p.scripts)-1].Path)
	}
	rt.transform = fn
	return rt, nil
}

// arm interrupts the runtime after d; the returned stop must be called once
// the runtime is idle again. It is safe against the timer firing as the
// run returns: the interrupt is cleared only after the timer can no longer
// set it.
func (rt *runtime) arm(d time.Duration) (stop func()) {
	var mu sync.Mutex
	done := false
	timer := time.AfterFunc(d, func() {
		mu.Lock()
		defer mu.Unlock()
		if !done {
			rt.vm.Interrupt(errTimeout)
		}
	})
	return func() {
		timer.Stop()
		mu.Lock()
		done = true
		mu.Unlock()
		rt.vm.ClearInterrupt()
	}
}

var (
	errTimeout   = errors.New("timeout")
	errCancelled = errors.New("cancelled")
	errMemory    = errors.New("memory")
)

// call runs transform on one message. reusable is false when the runtime
// must not serve another message.
func (rt *runtime) call(ctx context.Context, in Input) (outs []Output, err error, reusable bool) {
	c := &call{in: in, ctx: ctx}
	rt.cur = c
	clear(rt.msgs)
	clear(rt.segs)
	defer func() {
		rt.cur = nil
		clear(rt.msgs)
		clear(rt.segs)
	}()

	var mu sync.Mutex
	done := false
	interrupt := func(why error) {
		mu.Lock()
		defer mu.Unlock()
		if !done {
			rt.vm.Interrupt(why)
		}
	}
	timer := time.AfterFunc(rt.p.timeout, func() { interrupt(errTimeout) })
	stopCtx := context.AfterFunc(ctx, func() { interrupt(errCancelled) })
	stopHeap := watchHeap(rt.p.maxHeap, func() { interrupt(errMemory) })
	finish := func() {
		timer.Stop()
		stopCtx()
		stopHeap()
		mu.Lock()
		done = true
		mu.Unlock()
		rt.vm.ClearInterrupt()
	}

	defer func() {
		if r := recover(); r != nil {
			finish()
			outs, err, reusable = nil, &Error{Handler: rt.p.name, Kind: KindCrash, Message: clip(fmt.Sprint(r))}, false
		}
	}()

	work := in.Message.Clone()
	msgObj := rt.newMsg(work)
	ctxObj := rt.newCtx(in)
	ret, jsErr := rt.transform(goja.Undefined(), msgObj, ctxObj)
	finish()

	if jsErr != nil {
		// A plain throw leaves the runtime sound; an interrupt or a
		// runaway recursion stopped the script somewhere arbitrary.
		var ex *goja.Exception
		var ie *goja.InterruptedError
		var so *goja.StackOverflowError
		reusable := errors.As(jsErr, &ex) && !errors.As(jsErr, &ie) && !errors.As(jsErr, &so)
		return nil, rt.scriptError(c, jsErr), reusable
	}
	if c.err != nil {
		// A Go function stopped the script for a reason of its own, and
		// the script caught the exception: the reason still stands.
		return nil, c.err, true
	}
	outs, rerr := rt.result(ret, work, in)
	if rerr != nil {
		return nil, rerr, true
	}
	return outs, nil, true
}

// scriptError turns what the transform call returned into an error.
func (rt *runtime) scriptError(c *call, jsErr error) error {
	var ie *goja.InterruptedError
	if errors.As(jsErr, &ie) {
		switch ie.Value() {
		case errCancelled:
			return c.ctx.Err()
		case errTimeout:
			return &Error{Handler: rt.p.name, Kind: KindTimeout,
				Message: fmt.Sprintf("still running after %s", rt.p.timeout), Where: where(ie.Stack())}
		case errMemory:
			return &Error{Handler: rt.p.name, Kind: KindMemory,
				Message: fmt.Sprintf("allocated more than %d MiB (runaway allocation?)", rt.p.maxHeap>>20), Where: where(ie.Stack())}
		}
	}
	if c.err != nil {
		return c.err
	}
	var so *goja.StackOverflowError
	if errors.As(jsErr, &so) {
		return &Error{Handler: rt.p.name, Kind: KindException,
			Message: fmt.Sprintf("RangeError: call depth over %d (runaway recursion?)", config.MaxScriptCallDepth), Where: where(so.Stack())}
	}
	var ex *goja.Exception
	if errors.As(jsErr, &ex) {
		return &Error{Handler: rt.p.name, Kind: KindException, Message: clip(describeThrown(rt.vm, ex.Value())), Where: where(ex.Stack())}
	}
	return &Error{Handler: rt.p.name, Kind: KindException, Message: clip(jsErr.Error())}
}

// describeThrown renders a thrown value: an Error as "Name: message", a
// string as itself, anything else by its type only.
func describeThrown(vm *goja.Runtime, v goja.Value) string {
	if v == nil || goja.IsUndefined(v) || goja.IsNull(v) {
		return "threw " + fmt.Sprint(v)
	}
	if o, ok := v.(*goja.Object); ok {
		name, msg := o.Get("name"), o.Get("message")
		if name != nil && msg != nil && !goja.IsUndefined(name) {
			if m := msg.String(); m != "" {
				return name.String() + ": " + m
			}
			return name.String()
		}
		return "threw an object that is not an Error (throw new Error(\"...\") to say what went wrong)"
	}
	if s, ok := v.Export().(string); ok {
		return s
	}
	return "threw a " + typeOf(v)
}

// where is the innermost script position of a stack.
func where(stack []goja.StackFrame) string {
	for _, f := range stack {
		if f.SrcName() == "" || f.SrcName() == "<native>" {
			continue
		}
		pos := f.Position()
		if pos.Line == 0 {
			continue
		}
		return fmt.Sprintf("%s:%d:%d", pos.Filename, pos.Line, pos.Column)
	}
	return ""
}

func typeOf(v goja.Value) string {
	switch {
	case v == nil || goja.IsUndefined(v):
		return "undefined"
	case goja.IsNull(v):
		return "null"
	}
	switch v.Export().(type) {
	case string:
		return "string"
	case bool:
		return "boolean"
	case int64, float64:
		return "number"
	}
	if _, ok := goja.AssertFunction(v); ok {
		return "function"
	}
	if o, ok := v.(*goja.Object); ok && o.ClassName() == "Array" {
		return "array"
	}
	return "object"
}
