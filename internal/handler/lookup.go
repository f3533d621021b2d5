package handler

import (
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"

	"github.com/mefor/mefor/internal/hl7"
)

// OpLookup translates the value at From through a reference set and writes
// the result to Path.
const OpLookup OpKind = "lookup"

// MissPolicy says what a lookup does with a value its reference set lacks.
type MissPolicy string

const (
	// MissKeep writes the value itself, untranslated.
	MissKeep MissPolicy = "keep"
	// MissDefault writes the op's Default.
	MissDefault MissPolicy = "default"
	// MissDeadLetter fails the message, which dead-letters it.
	MissDeadLetter MissPolicy = "dead-letter"
)

// Lookup answers reference-set lookups. found is false for a key the set
// lacks. An error means there is no answer: one wrapping ErrNotReady when
// the set has no data yet, anything else for a lookup that can never work
// (such as a column the set does not have).
type Lookup interface {
	Lookup(set, key, column string) (value string, found bool, err error)
}

// ErrNotReady marks a handler error that is not the message's fault and
// goes away by itself, such as a reference set with no snapshot yet: the
// message is to be retried later, not dead-lettered.
var ErrNotReady = errors.New("not ready, retry later")

// MapOption configures NewMap.
type MapOption func(*mapOptions)

type mapOptions struct {
	lookup Lookup
	logger *slog.Logger
}

// WithLookup gives a Map the reference sets its lookup ops read.
func WithLookup(l Lookup) MapOption {
	return func(o *mapOptions) { o.lookup = l }
}

func compileLookup(op MapOp, lookup Lookup) (step, error) {
	if lookup == nil {
		return nil, errors.New("lookup needs reference sets, and none were given to the map")
	}
	if op.Set == "" {
		return nil, errors.New("lookup needs a set")
	}
	if op.From == "" {
		return nil, errors.New("lookup needs from")
	}
	from, err := hl7.ParsePath(op.From)
	if err != nil {
		return nil, fmt.Errorf("from: %w", err)
	}
	toText := op.Path
	if toText == "" {
		toText = op.From
	}
	to, err := target(toText)
	if err != nil {
		return nil, err
	}
	if op.OnMiss == "" {
		op.OnMiss = MissDeadLetter
	}
	switch op.OnMiss {
	case MissKeep, MissDeadLetter:
		if op.Default != "" {
			return nil, errors.New("default only applies to on_miss default")
		}
	case MissDefault:
	default:
		return nil, fmt.Errorf("unknown on_miss %q: want %q, %q or %q", op.OnMiss, MissKeep, MissDefault, MissDeadLetter)
	}
	s := lookupStep{
		lookup: lookup, set: op.Set, column: op.Column, onMiss: op.OnMiss, def: op.Default,
		from: from, to: to,
	}
	// "OBX-3.1" in a result with ten OBX segments means every one of them:
	// translating only the first would pass nine codes on unmapped. So
	// when both sides name the same segment without an occurrence, the op
	// runs once per occurrence, reading and writing the same segment.
	fs, ts := from.String(), to.String()
	if fs[:3] == ts[:3] && fs[3] == '-' && ts[3] == '-' {
		s.segment, s.fromRest, s.toRest = fs[:3], fs[3:], ts[3:]
	}
	return s, nil
}

type lookupStep struct {
	lookup      Lookup
	set, column string
	onMiss      MissPolicy
	def         string
	from, to    hl7.Path
	// segment is set when the op applies to every occurrence of it; the
	// paths are then segment + "(k)" + rest.
	segment, fromRest, toRest string
}

func (s lookupStep) apply(msg *hl7.Message) error {
	if s.segment == "" {
		return s.applyOne(msg, s.from, s.to)
	}
	n := msg.Count(s.segment)
	for k := 1; k <= n; k++ {
		occ := s.segment + "(" + strconv.Itoa(k) + ")"
		from, err := hl7.ParsePath(occ + s.fromRest)
		if err != nil {
			return err
		}
		to, err := hl7.ParsePath(occ + s.toRest)
		if err != nil {
			return err
		}
		if err := s.applyOne(msg, from, to); err != nil {
			return err
		}
	}
	return nil
}

func (s lookupStep) applyOne(msg *hl7.Message, from, to hl7.Path) error {
	key := msg.GetPath(from)
	if key == "" {
		// Nothing to translate: an absent or empty code is left as it is,
		// whatever the miss policy, so optional fields don't dead-letter.
		return nil
	}
	value, found, err := s.lookup.Lookup(s.set, key, s.column)
	if err != nil {
		return fmt.Errorf("lookup %s in reference set %q: %w", from, s.set, err)
	}
	if !found {
		switch s.onMiss {
		case MissKeep:
			value = key
		case MissDefault:
			value = s.def
		default:
			// The code itself is not quoted: errors must not carry content.
			return fmt.Errorf("lookup %s: the value is not in reference set %q (on_miss: dead-letter; add the code to the set, or set on_miss: keep or default)",
				from, s.set)
		}
	}
	if from == to && value == key {
		return nil
	}
	return msg.SetPath(to, value)
}

// describeOps is the list of op kinds for error messages.
func describeOps() string {
	kinds := []string{strconv.Quote(string(OpSet)), strconv.Quote(string(OpCopy)), strconv.Quote(string(OpClear))}
	return strings.Join(kinds, ", ") + " or " + strconv.Quote(string(OpLookup))
}
