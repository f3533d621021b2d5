package config

import (
	"bytes"
	"cmp"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
)

// Load reads, interpolates and validates the configuration file at path,
// taking ${VAR} values from the process environment. Problems with the
// content are returned as Errors.
func Load(path string) (*Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read config: %w", err)
	}
	return Parse(path, data, os.LookupEnv)
}

// Parse is Load for content already in memory. name is used in messages;
// getenv resolves ${VAR} references and may be nil for an empty
// environment. Problems with the content are returned as Errors.
func Parse(name string, data []byte, getenv func(string) (string, bool)) (*Config, error) {
	if getenv == nil {
		getenv = func(string) (string, bool) { return "", false }
	}
	l := &loader{
		file:   name,
		getenv: getenv,
		pos:    make(map[path]position),
		bad:    make(map[path]bool),
	}
	root, err := parseYAML(data)
	if err == nil {
		err = checkExpansion(root)
	}
	if err != nil {
		return nil, Errors{l.syntaxError(err)}
	}
	c := l.decode(root)
	l.validate(c)
	if len(l.errs) > 0 {
		return nil, Errors(sortByPosition(l.errs))
	}
	c.File = name
	c.Warnings = sortByPosition(l.warnings)
	c.sum = sha256.Sum256(append(slices.Clip(data), scriptSums(c)...))
	c.pos = l.pos
	return c, nil
}

// parseYAML returns the file's single document, or nil for an empty file.
func parseYAML(data []byte) (*yaml.Node, error) {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var doc yaml.Node
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, nil
		}
		return nil, err
	}
	for {
		var next yaml.Node
		err := dec.Decode(&next)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, err
		}
		// A trailing "---" is harmless, but silently ignoring a second
		// document with content would hide half of a file that was
		// concatenated by mistake.
		if len(next.Content) > 0 && !isNull(next.Content[0]) {
			return nil, fmt.Errorf("yaml: line %d: a second YAML document starts here; a configuration file holds exactly one", next.Line)
		}
	}
	if len(doc.Content) == 0 {
		return nil, nil
	}
	return doc.Content[0], nil
}

// maxExpandedNodes bounds the size of a document with its aliases expanded.
// Aliases let a small file describe an exponentially large tree (the
// "billion laughs"), and decoding walks the expanded tree, so such a file is
// refused up front rather than hanging the loader. Real configurations are
// orders of magnitude smaller.
const maxExpandedNodes = 1 << 20

// checkExpansion returns an error if an alias in root refers to a node that
// contains it, or if root expands to more than maxExpandedNodes nodes.
func checkExpansion(root *yaml.Node) error {
	if root == nil {
		return nil
	}
	const visiting = -1
	sizes := make(map[*yaml.Node]int) // expanded size of each node seen
	var size func(n *yaml.Node) (int, error)
	size = func(n *yaml.Node) (int, error) {
		if n.Kind == yaml.AliasNode && n.Alias != nil {
			if sizes[n.Alias] == visiting {
				return 0, fmt.Errorf("yaml: line %d: alias *%s refers to a node that contains it", n.Line, n.Value)
			}
			n = n.Alias
		}
		if s, ok := sizes[n]; ok {
			return s, nil
		}
		sizes[n] = visiting
		total := 1
		for _, c := range n.Content {
			s, err := size(c)
			if err != nil {
				return 0, err
			}
			total = min(total+s, maxExpandedNodes+1) // saturate: no overflow
		}
		sizes[n] = total
		return total, nil
	}
	total, err := size(root)
	if err == nil && total > maxExpandedNodes {
		err = fmt.Errorf("yaml: aliases expand the file to more than %d values", maxExpandedNodes)
	}
	return err
}

// loader decodes and validates one file, collecting every problem instead of
// stopping at the first.
type loader struct {
	file   string
	getenv func(string) (string, bool)

	// pos says where each given field is written. A field missing from it
	// was left to its default.
	pos map[path]position
	// bad holds fields that failed to decode. Validation stays quiet about
	// them and everything below them, so one typo yields one error rather
	// than a cascade of "is required".
	bad map[path]bool

	errs     Errors
	warnings []Error
}

// syntaxError turns a YAML parser error into an Error, pulling the line out
// of the parser's "yaml: line N: problem" text.
func (l *loader) syntaxError(err error) Error {
	msg := strings.TrimPrefix(err.Error(), "yaml: ")
	line := 0
	if rest, ok := strings.CutPrefix(msg, "line "); ok {
		if num, problem, ok := strings.Cut(rest, ": "); ok {
			if n, err := strconv.Atoi(num); err == nil {
				line, msg = n, problem
			}
		}
	}
	return Error{File: l.file, Line: line, Message: "invalid YAML: " + msg}
}

// position is where something is written in the file.
type position struct {
	line, column int
}

func (l *loader) problem(at position, p path, format string, args ...any) Error {
	return Error{
		File:    l.file,
		Line:    at.line,
		Field:   p.String(),
		Message: fmt.Sprintf(format, args...),
		prefix:  p.prefix(),
		column:  at.column,
	}
}

// errorAt records a decoding problem with the field at p, found at node n.
func (l *loader) errorAt(n *yaml.Node, p path, format string, args ...any) {
	l.errs = append(l.errs, l.problem(position{n.Line, n.Column}, p, format, args...))
}

// record notes that the field at p is written at node n.
func (l *loader) record(p path, n *yaml.Node) {
	l.pos[p] = position{n.Line, n.Column}
}

// errorf records a validation problem with the field at p, on the line of p
// or of the closest enclosing field written in the file. It does nothing if
// p already failed to decode.
func (l *loader) errorf(p path, format string, args ...any) {
	if l.failed(p) {
		return
	}
	l.errs = append(l.errs, l.problem(l.position(p), p, format, args...))
}

// warnf records a warning, located like errorf.
func (l *loader) warnf(p path, format string, args ...any) {
	l.warnings = append(l.warnings, l.problem(l.position(p), p, format, args...))
}

// given reports whether the field at p is written in the file.
func (l *loader) given(p path) bool {
	_, ok := l.pos[p]
	return ok
}

// position returns where p is written, or where its closest enclosing field
// is: a missing required key is reported where it should have been.
func (l *loader) position(p path) position {
	for {
		if at, ok := l.pos[p]; ok {
			return at
		}
		var ok bool
		if p, ok = p.parent(); !ok {
			return position{line: 1, column: 1}
		}
	}
}

// failed reports whether p or a field enclosing it failed to decode.
func (l *loader) failed(p path) bool {
	for {
		if l.bad[p] {
			return true
		}
		var ok bool
		if p, ok = p.parent(); !ok {
			return false
		}
	}
}

// sortByPosition puts problems in file order. The sort is stable so that
// problems found at the same place keep the order they were found in.
func sortByPosition(errs []Error) []Error {
	slices.SortStableFunc(errs, func(a, b Error) int {
		return cmp.Or(cmp.Compare(a.Line, b.Line), cmp.Compare(a.column, b.column))
	})
	return errs
}
