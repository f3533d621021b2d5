package handler

import (
	"context"
	"errors"
	"fmt"

	"github.com/mefor/mefor/internal/hl7"
)

// OpKind names what a MapOp does.
type OpKind string

const (
	// OpSet sets Path to the literal Value.
	OpSet OpKind = "set"

	// OpCopy copies the element at From, structure included, to Path. An
	// absent From clears Path.
	OpCopy OpKind = "copy"

	// OpClear empties Path, keeping its position.
	OpClear OpKind = "clear"
)

// MapOp is one operation of a Map. Paths use hl7.ParsePath syntax, e.g.
// "PID-3[2].1".
type MapOp struct {
	Op OpKind

	// Path is the element the op writes: the target of set and clear, the
	// destination of copy.
	Path string

	// Value is the literal a set writes. Delimiters in it are escaped, so it
	// is stored as one value.
	Value string

	// From is the element a copy or lookup reads.
	From string

	// Set, Column, OnMiss and Default configure a lookup: the reference
	// set, its value column ("" for the set's first), what a miss does
	// (dead-letter when empty) and what MissDefault writes. A lookup's
	// Path defaults to From: the field is translated in place.
	Set     string
	Column  string
	OnMiss  MissPolicy
	Default string
}

// Map applies ordered operations to a copy of the message, so each op sees
// the result of the ones before it and the caller's message is left alone.
// A Map is immutable once built and safe for concurrent use.
type Map struct {
	steps []step
}

// step is one compiled op. Ops are compiled into steps so that NewMap checks
// every path once and Handle does no parsing.
//
// This is where new ops plug in: an OpKind, its fields on MapOp, a case in
// compile and a step type. lookup (lookup.go) is one, with what it needs
// beyond the message given to NewMap as an option.
type step interface {
	apply(msg *hl7.Message) error
}

// NewMap checks ops and builds the Map. Every problem in configuration —
// unknown op, bad or missing path, a field that does not belong to the op,
// a target that cannot be written — is reported here rather than when the
// first message arrives, with the index of the op in ops.
func NewMap(ops []MapOp, opts ...MapOption) (*Map, error) {
	var o mapOptions
	for _, opt := range opts {
		opt(&o)
	}
	m := &Map{steps: make([]step, 0, len(ops))}
	for i, op := range ops {
		s, err := compile(op, o)
		if err != nil {
			return nil, fmt.Errorf("map ops[%d] (%s): %w", i, op.Op, err)
		}
		m.steps = append(m.steps, s)
	}
	return m, nil
}

func compile(op MapOp, o mapOptions) (step, error) {
	switch op.Op {
	case OpLookup:
		return compileLookup(op, o.lookup)
	case OpSet:
		if op.From != "" {
			return nil, errors.New("set takes a value, not from")
		}
		to, err := target(op.Path)
		if err != nil {
			return nil, err
		}
		return setStep{to: to, value: op.Value}, nil
	case OpCopy:
		if op.Value != "" {
			return nil, errors.New("copy takes from, not a value")
		}
		if op.From == "" {
			return nil, errors.New("copy needs from")
		}
		from, err := hl7.ParsePath(op.From)
		if err != nil {
			return nil, fmt.Errorf("from: %w", err)
		}
		to, err := target(op.Path)
		if err != nil {
			return nil, err
		}
		return copyStep{from: from, to: to}, nil
	case OpClear:
		if op.Value != "" || op.From != "" {
			return nil, errors.New("clear takes only a path")
		}
		to, err := target(op.Path)
		if err != nil {
			return nil, err
		}
		return clearStep{to: to}, nil
	}
	return nil, fmt.Errorf("unknown op %q: want %s", op.Op, describeOps())
}

// target parses a path an op writes to.
func target(s string) (hl7.Path, error) {
	if s == "" {
		return hl7.Path{}, errors.New("path is required")
	}
	p, err := hl7.ParsePath(s)
	if err != nil {
		return hl7.Path{}, err
	}
	if p.ReadOnly() {
		return hl7.Path{}, fmt.Errorf("path %s cannot be written: MSH-1 and MSH-2 hold the delimiters and a message has one MSH", p)
	}
	return p, nil
}

// Handle returns a copy of msg with the ops applied in order.
func (m *Map) Handle(ctx context.Context, msg *hl7.Message) (*hl7.Message, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if msg == nil {
		return nil, errors.New("map: nil message")
	}
	out := msg.Clone()
	for i, s := range m.steps {
		if err := s.apply(out); err != nil {
			return nil, fmt.Errorf("map ops[%d]: %w", i, err)
		}
	}
	return out, nil
}

type setStep struct {
	to    hl7.Path
	value string
}

func (s setStep) apply(msg *hl7.Message) error { return msg.SetPath(s.to, s.value) }

type copyStep struct{ from, to hl7.Path }

func (s copyStep) apply(msg *hl7.Message) error { return msg.Copy(s.from, s.to) }

type clearStep struct{ to hl7.Path }

func (s clearStep) apply(msg *hl7.Message) error { return msg.ClearPath(s.to) }
