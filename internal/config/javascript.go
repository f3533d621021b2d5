package config

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/dop251/goja"
	"github.com/dop251/goja/parser"
	"go.yaml.in/yaml/v3"
)

// HandlerJavaScript runs a script's transform(msg, ctx) on each message.
const HandlerJavaScript HandlerType = "javascript"

// JavaScript is a javascript handler's settings. Load reads and compiles
// the scripts, so a config that loaded holds scripts that compile and
// define transform; a changed script is a changed config (see Hash).
type JavaScript struct {
	// File defines function transform(msg, ctx). Relative paths are
	// resolved against mefor's working directory, like every other path.
	File string
	// Libs are loaded before File, in order, into the same global scope:
	// shared functions several handlers use.
	Libs []string
	// Timeout bounds one message's transform; past it the script is
	// interrupted and the message fails. Defaults to 1s.
	Timeout time.Duration
	// OnError says what a failing transform (a throw, a timeout, a result
	// that is not a message) does to its message. Defaults to dead-letter.
	OnError OnScriptError
	// LogContent lets ctx.log write the script's arguments to the node's
	// log as they are. Off, a ctx.log line carries only each argument's
	// type and size, since logs are often shipped where patient data may
	// not go. Defaults to false; config check warns when it is on.
	LogContent bool
	// Scripts are the libs then File, as read and compiled at load time.
	Scripts []Script
}

// Script is one JavaScript file as loaded.
type Script struct {
	// Path is the path as written in the config, which is what errors and
	// stack traces show.
	Path string
	// Source is the file's content when the config was loaded.
	Source string
	// Program is Source compiled. It is immutable and may run in any number
	// of runtimes at once.
	Program *goja.Program
}

// OnScriptError is what a failing script does to its message.
type OnScriptError string

const (
	// ScriptDeadLetter dead-letters the message with the script's error and
	// line; the lane moves on.
	ScriptDeadLetter OnScriptError = "dead-letter"
	// ScriptHold keeps the lane at the message and retries it with backoff:
	// for scripts that depend on something not ready yet.
	ScriptHold OnScriptError = "hold"
)

const (
	defaultScriptTimeout = time.Second
	// maxScriptTimeout keeps one transform well inside a drainer's job
	// time limit (its slice plus a minute).
	maxScriptTimeout = 30 * time.Second
	// maxScriptSize bounds a script file; real transforms are a few KB.
	maxScriptSize = 4 << 20
	// MaxScriptCallDepth bounds JavaScript recursion. Without a bound a
	// runaway recursion grows the Go stack until the process dies, which
	// no recover can catch.
	MaxScriptCallDepth = 1000
)

func decodeJavaScript(l *loader, n *yaml.Node, p path, h *Handler) {
	js := &JavaScript{Timeout: defaultScriptTimeout, OnError: ScriptDeadLetter}
	h.JavaScript = js
	m := l.mapping(n, p, "file", "libs", "timeout", "on_error", "log_content")
	decodeScalar(l, m, p, "file", &js.File, asString)
	l.strings(m, p, "libs", &js.Libs)
	decodeScalar(l, m, p, "timeout", &js.Timeout, parseDuration)
	decodeScalar(l, m, p, "on_error", &js.OnError, asString)
	decodeScalar(l, m, p, "log_content", &js.LogContent, parseBool)
}

func checkJavaScript(l *loader, h *Handler, p path) {
	js := h.JavaScript
	if js == nil {
		return
	}
	jp := p.key(string(HandlerJavaScript))
	fp := jp.key("file")
	if !l.given(fp) || strings.TrimSpace(js.File) == "" {
		l.errorf(fp, "is required: the script defining function transform(msg, ctx) (e.g. file: ./handlers/%s.js; relative to mefor's working directory)", h.Name)
	}
	tp := jp.key("timeout")
	switch {
	case l.failed(tp):
	case js.Timeout <= 0:
		l.errorf(tp, "must be > 0 (e.g. timeout: 500ms); it bounds one message's transform")
	case js.Timeout > maxScriptTimeout:
		l.errorf(tp, "%s is too long: at most %s, or a lane waits that long on one runaway message (e.g. timeout: 1s)",
			fmtDuration(js.Timeout), fmtDuration(maxScriptTimeout))
	}
	ep := jp.key("on_error")
	if modes := []OnScriptError{ScriptDeadLetter, ScriptHold}; !l.failed(ep) && !slices.Contains(modes, js.OnError) {
		l.errorf(ep, "%q is not an error policy (one of %s)%s", js.OnError, joinStrings(modes),
			didYouMean(string(js.OnError), toStrings(modes), "%s"))
	}

	if js.LogContent {
		l.warnf(jp.key("log_content"), "is on: ctx.log writes what the script gives it, message content included, to the node's log; "+
			"log ids and counts instead and remove log_content, unless the log is cleared for patient data")
	}

	lp := jp.key("libs")
	ok := true
	for i, lib := range js.Libs {
		s, good := l.loadScript(lp.index(i), lib)
		ok = ok && good
		js.Scripts = append(js.Scripts, s)
	}
	if js.File == "" || l.failed(fp) {
		return
	}
	s, good := l.loadScript(fp, js.File)
	js.Scripts = append(js.Scripts, s)
	if ok && good && js.Timeout > 0 {
		if msg := checkDefinesTransform(js.Scripts, min(js.Timeout, maxScriptTimeout)); msg != "" {
			l.errorf(fp, "%s", msg)
		}
	}
}

// loadScript reads and compiles one script named at p.
func (l *loader) loadScript(p path, file string) (Script, bool) {
	s := Script{Path: file}
	if strings.TrimSpace(file) == "" {
		l.errorf(p, "is blank; name a JavaScript file (e.g. ./handlers/lib/common.js)")
		return s, false
	}
	info, err := os.Stat(file)
	switch {
	case err != nil:
		l.errorf(p, "%s cannot be read: %v%s", file, unwrapPathError(err), relativeHint(file))
		return s, false
	case info.IsDir():
		l.errorf(p, "%s is a directory; name the .js file", file)
		return s, false
	case info.Size() > maxScriptSize:
		l.errorf(p, "%s is %d bytes; scripts are limited to %d", file, info.Size(), maxScriptSize)
		return s, false
	}
	src, err := os.ReadFile(file)
	if err != nil {
		l.errorf(p, "%s cannot be read: %v%s", file, unwrapPathError(err), relativeHint(file))
		return s, false
	}
	s.Source = string(src)
	prg, err := compileScript(file, s.Source)
	if err != nil {
		l.errorf(p, "%s", describeCompileError(file, err))
		return s, false
	}
	s.Program = prg
	return s, true
}

// compileScript parses and compiles one script. It parses first itself,
// because goja.Compile flattens a parse error's position into its text.
func compileScript(file, src string) (*goja.Program, error) {
	ast, err := parser.ParseFile(nil, file, src, 0)
	if err != nil {
		return nil, err
	}
	return goja.CompileAST(ast, false)
}

// describeCompileError renders a compile error as file:line:col first, the
// way editors and compilers print them, so the script's line can be found
// without reading the whole message.
func describeCompileError(file string, err error) string {
	var list parser.ErrorList
	if errors.As(err, &list) && len(list) > 0 {
		// The first error only: the parser's later ones mostly follow
		// from it.
		e := list[0]
		return fmt.Sprintf("%s:%d:%d: SyntaxError: %s", file, e.Position.Line, e.Position.Column, e.Message)
	}
	var pe *parser.Error
	if errors.As(err, &pe) {
		return fmt.Sprintf("%s:%d:%d: SyntaxError: %s", file, pe.Position.Line, pe.Position.Column, pe.Message)
	}
	var se *goja.CompilerSyntaxError
	if errors.As(err, &se) && se.File != nil {
		pos := se.File.Position(se.Offset)
		return fmt.Sprintf("%s:%d:%d: SyntaxError: %s", file, pos.Line, pos.Column, se.Message)
	}
	return fmt.Sprintf("%s: %v", file, err)
}

// checkDefinesTransform runs the scripts' top level in a fresh runtime, as
// every node does before its first message, and says what is wrong if
// that throws, runs too long or leaves no function transform.
func checkDefinesTransform(scripts []Script, timeout time.Duration) string {
	vm := goja.New()
	vm.SetMaxCallStackSize(MaxScriptCallDepth)
	var mu sync.Mutex
	done := false
	timer := time.AfterFunc(timeout, func() {
		mu.Lock()
		defer mu.Unlock()
		if !done {
			vm.Interrupt("timeout")
		}
	})
	defer func() {
		timer.Stop()
		mu.Lock()
		done = true
		mu.Unlock()
	}()
	for _, s := range scripts {
		if _, err := runSafely(vm, s.Program); err != nil {
			var ie *goja.InterruptedError
			if errors.As(err, &ie) {
				return fmt.Sprintf("%s: its top-level code ran longer than the handler's timeout (%s); keep the top level to definitions", s.Path, fmtDuration(timeout))
			}
			return fmt.Sprintf("%s: its top-level code fails: %s", s.Path, firstLine(err.Error()))
		}
	}
	file := scripts[len(scripts)-1].Path
	if _, ok := goja.AssertFunction(vm.Get("transform")); !ok {
		return fmt.Sprintf("%s does not define function transform(msg, ctx); add one, e.g. function transform(msg, ctx) { msg.set(\"MSH-5\", \"LAB\"); }", file)
	}
	return ""
}

// runSafely runs a program, turning a panic inside goja into an error.
func runSafely(vm *goja.Runtime, prg *goja.Program) (v goja.Value, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("the JavaScript engine failed: %v", r)
		}
	}()
	return vm.RunProgram(prg)
}

func firstLine(s string) string {
	s, _, _ = strings.Cut(s, "\n")
	return s
}

func unwrapPathError(err error) error {
	var pe *os.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}

// relativeHint says where a relative path was looked for.
func relativeHint(file string) string {
	if filepath.IsAbs(file) {
		return ""
	}
	wd, err := os.Getwd()
	if err != nil {
		return " (relative paths are resolved against mefor's working directory)"
	}
	return fmt.Sprintf(" (relative paths are resolved against mefor's working directory, %s)", wd)
}

// scriptSums lists what Hash covers beyond the file: every script's path
// and content, so nodes running the same file with different scripts are
// told apart and a reload picks up a changed script.
func scriptSums(c *Config) []byte {
	var b strings.Builder
	for _, h := range c.Handlers {
		if h.JavaScript == nil {
			continue
		}
		for _, s := range h.JavaScript.Scripts {
			fmt.Fprintf(&b, "\x00script %s %q %d\x00%s", h.Name, s.Path, len(s.Source), s.Source)
		}
	}
	return []byte(b.String())
}

// scriptMentions reports whether any script of c contains text, for the
// "reference set not used" warning: a script's lookups are not known until
// it runs.
func scriptMentions(c *Config, text string) bool {
	for _, h := range c.Handlers {
		if h.JavaScript == nil {
			continue
		}
		for _, s := range h.JavaScript.Scripts {
			if strings.Contains(s.Source, text) {
				return true
			}
		}
	}
	return false
}
