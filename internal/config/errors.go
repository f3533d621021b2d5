package config

import (
	"fmt"
	"strconv"
	"strings"
)

// Error is one problem in a configuration file, located precisely enough to
// fix it without searching:
//
//	mefor.yaml:23: destination "lab": retry.backoff must be > 0 (e.g. backoff: 1s)
type Error struct {
	File string
	// Line is 1-based.
	Line int
	// Field is the path of the offending key from the top of the file, such
	// as destinations.lab.retry.backoff or channels.adt.routes[0].handler.
	// It is empty for problems with the file as a whole.
	Field string
	// Message says what is wrong and how to fix it.
	Message string

	// prefix is Field as people read it, with its separator, such as
	// `destination "lab": retry.backoff `.
	prefix string
	// column orders problems on the same line.
	column int
}

func (e Error) Error() string {
	var b strings.Builder
	b.WriteString(e.File)
	if e.Line > 0 {
		b.WriteString(":")
		b.WriteString(strconv.Itoa(e.Line))
	}
	b.WriteString(": ")
	switch {
	case e.prefix != "":
		b.WriteString(e.prefix)
	case e.Field != "":
		b.WriteString(e.Field)
		b.WriteString(": ")
	}
	b.WriteString(e.Message)
	return b.String()
}

// Errors is every problem found in a configuration file, in file order. Load
// and Parse return it as their error so that all problems can be fixed in one
// go; use errors.As to get at the individual items.
type Errors []Error

func (es Errors) Error() string {
	lines := make([]string, len(es))
	for i, e := range es {
		lines[i] = e.Error()
	}
	return strings.Join(lines, "\n")
}

// Unwrap lets errors.As and errors.Is see the individual problems.
func (es Errors) Unwrap() []error {
	errs := make([]error, len(es))
	for i, e := range es {
		errs[i] = e
	}
	return errs
}

// path locates a field in the file. Names are kept apart from the keys
// leading to them because names may contain dots and because errors read
// better as `destination "lab": retry.backoff` than as a dotted path.
type path struct {
	section string // top-level key: cluster, channels, handlers, destinations
	named   bool   // name is set: the path is inside a named entity
	name    string
	rel     string // keys and indexes below the section or entity: retry.backoff, routes[0].match
}

// key returns the path of key k below p.
func (p path) key(k string) path {
	switch {
	case p.section == "":
		p.section = k
	case p.rel == "":
		p.rel = k
	default:
		p.rel += "." + k
	}
	return p
}

// entity returns the path of the entity called name in section p.
func (p path) entity(name string) path {
	p.named, p.name = true, name
	return p
}

// index returns the path of item i of the list at p.
func (p path) index(i int) path {
	p.rel += "[" + strconv.Itoa(i) + "]"
	return p
}

// parent returns the path containing p; ok is false for the top of the file.
func (p path) parent() (parent path, ok bool) {
	switch {
	case p.rel != "":
		p.rel = p.rel[:max(strings.LastIndexAny(p.rel, ".["), 0)]
	case p.named:
		p.named, p.name = false, ""
	case p.section != "":
		p.section = ""
	default:
		return p, false
	}
	return p, true
}

func (p path) String() string {
	var b strings.Builder
	b.WriteString(p.section)
	if p.named {
		if strings.Contains(p.name, ".") || p.name == "" {
			fmt.Fprintf(&b, "[%q]", p.name)
		} else {
			b.WriteString("." + p.name)
		}
	}
	if p.rel != "" {
		b.WriteString("." + p.rel)
	}
	return b.String()
}

// prefix renders p for the start of a message, separator included.
func (p path) prefix() string {
	switch {
	case p.section == "":
		return ""
	case !p.named:
		return p.String() + " "
	case p.rel == "":
		return fmt.Sprintf("%s %q: ", p.kind(), p.name)
	default:
		return fmt.Sprintf("%s %q: %s ", p.kind(), p.name, p.rel)
	}
}

// kind names what the entity at p is: channel, handler or destination.
func (p path) kind() string {
	return strings.TrimSuffix(p.section, "s")
}
