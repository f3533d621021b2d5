package handler

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"

	"github.com/mefor/mefor/internal/hl7"
)

func TestNewMapErrors(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		ops  []MapOp
		want string
	}{
		{
			"bad path",
			[]MapOp{{Op: OpSet, Path: "PID-1", Value: "x"}, {Op: OpSet, Path: "PID-x", Value: "y"}},
			`map ops[1] (set): hl7 path "PID-x": field must be a number`,
		},
		{
			"bad from",
			[]MapOp{{Op: OpCopy, From: "PID-3.", Path: "PID-2"}},
			`map ops[0] (copy): from: hl7 path "PID-3.": component must be a number`,
		},
		{
			"missing path",
			[]MapOp{{Op: OpClear}},
			`map ops[0] (clear): path is required`,
		},
		{
			"copy without from",
			[]MapOp{{Op: OpCopy, Path: "PID-2"}},
			`map ops[0] (copy): copy needs from`,
		},
		{
			"copy with value",
			[]MapOp{{Op: OpCopy, From: "PID-3", Path: "PID-2", Value: "x"}},
			`map ops[0] (copy): copy takes from, not a value`,
		},
		{
			"set with from",
			[]MapOp{{Op: OpSet, From: "PID-3", Path: "PID-2"}},
			`map ops[0] (set): set takes a value, not from`,
		},
		{
			"clear with value",
			[]MapOp{{Op: OpClear, Path: "PID-2", Value: "x"}},
			`map ops[0] (clear): clear takes only a path`,
		},
		{
			"unknown op",
			[]MapOp{{Op: "translate", Path: "PID-2"}},
			`map ops[0] (translate): unknown op "translate": want "set", "copy", "clear" or "lookup"`,
		},
		{
			"delimiter field",
			[]MapOp{{Op: OpSet, Path: "MSH-2", Value: "x"}},
			`map ops[0] (set): path MSH-2 cannot be written: MSH-1 and MSH-2 hold the delimiters and a message has one MSH`,
		},
		{
			"second MSH",
			[]MapOp{{Op: OpCopy, From: "PID-3", Path: "MSH(2)-3"}},
			`map ops[0] (copy): path MSH(2)-3 cannot be written: MSH-1 and MSH-2 hold the delimiters and a message has one MSH`,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			m, err := NewMap(tt.ops)
			if err == nil {
				t.Fatalf("NewMap succeeded: %+v", m)
			}
			if err.Error() != tt.want {
				t.Errorf("NewMap error\n got: %s\nwant: %s", err, tt.want)
			}
		})
	}

	_, err := NewMap([]MapOp{{Op: OpSet, Path: "PID-x"}})
	var pe *hl7.PathError
	if !errors.As(err, &pe) {
		t.Errorf("NewMap error %v does not unwrap to *hl7.PathError", err)
	}
}

func TestMapHandle(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		ops  []MapOp
		want []string // segments of the result after MSH
		msh  string   // expected MSH, if it changes
	}{
		{
			name: "no ops",
			want: []string{"PID|1||123^^^HOSP^MR~456^^^SSA^SS||DOE^JANE^Q||19700101|F", "PV1|1|I|W1^101^A"},
		},
		{
			name: "set, escaping delimiters",
			ops:  []MapOp{{Op: OpSet, Path: "PV1-3.1", Value: "W2|east"}},
			want: []string{"PID|1||123^^^HOSP^MR~456^^^SSA^SS||DOE^JANE^Q||19700101|F", `PV1|1|I|W2\F\east^101^A`},
		},
		{
			name: "set in the header",
			ops:  []MapOp{{Op: OpSet, Path: "MSH-5", Value: "NEWLAB"}, {Op: OpSet, Path: "MSH-9.2", Value: "A08"}},
			msh:  "MSH|^~\\&|ADT1|HOSP|NEWLAB|HOSP|20240101120000||ADT^A08^ADT_A01|MSG1|P|2.5.1",
			want: []string{"PID|1||123^^^HOSP^MR~456^^^SSA^SS||DOE^JANE^Q||19700101|F", "PV1|1|I|W1^101^A"},
		},
		{
			name: "copy a repetition with its components",
			ops:  []MapOp{{Op: OpCopy, From: "PID-3[2]", Path: "PID-2"}},
			want: []string{"PID|1|456^^^SSA^SS|123^^^HOSP^MR~456^^^SSA^SS||DOE^JANE^Q||19700101|F", "PV1|1|I|W1^101^A"},
		},
		{
			name: "clear",
			ops:  []MapOp{{Op: OpClear, Path: "PID-3[2]"}, {Op: OpClear, Path: "PID-5.3"}},
			want: []string{"PID|1||123^^^HOSP^MR~||DOE^JANE^||19700101|F", "PV1|1|I|W1^101^A"},
		},
		{
			name: "ops apply in order",
			ops: []MapOp{
				{Op: OpSet, Path: "PID-3[1].4", Value: "MAIN"},
				{Op: OpCopy, From: "PID-3[1]", Path: "ZID-1"},
				{Op: OpClear, Path: "PID-3"},
			},
			want: []string{"PID|1||||DOE^JANE^Q||19700101|F", "PV1|1|I|W1^101^A", "ZID|123^^^MAIN^MR"},
		},
		{
			name: "copy from an absent element clears",
			ops:  []MapOp{{Op: OpCopy, From: "PID-30", Path: "PID-8"}},
			want: []string{"PID|1||123^^^HOSP^MR~456^^^SSA^SS||DOE^JANE^Q||19700101|", "PV1|1|I|W1^101^A"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			m, err := NewMap(tt.ops)
			if err != nil {
				t.Fatal(err)
			}
			in := parse(t, adt)
			out, err := m.Handle(context.Background(), in)
			if err != nil {
				t.Fatalf("Handle: %v", err)
			}
			msh := tt.msh
			if msh == "" {
				msh = strings.Split(adt, "\r")[0]
			}
			want := strings.Join(append([]string{msh}, tt.want...), "\r") + "\r"
			if got := string(out.Encode()); got != want {
				t.Errorf("result\n got: %q\nwant: %q", got, want)
			}
			if got := string(in.Encode()); got != adt {
				t.Errorf("Handle changed its input:\n%q", got)
			}
			if out == in {
				t.Error("Handle returned its input instead of a copy")
			}
		})
	}
}

func TestMapHandleErrors(t *testing.T) {
	t.Parallel()
	m, err := NewMap([]MapOp{{Op: OpSet, Path: "PID-1", Value: "x"}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := m.Handle(ctx, parse(t, adt)); !errors.Is(err, context.Canceled) {
		t.Errorf("Handle with cancelled context = %v", err)
	}
	if _, err := m.Handle(context.Background(), nil); err == nil {
		t.Error("Handle(nil) succeeded")
	}
	if _, err := m.Handle(context.Background(), &hl7.Message{}); err == nil || !strings.HasPrefix(err.Error(), "map ops[0]: ") {
		t.Errorf("Handle of a message without MSH = %v", err)
	}
}

func TestMapConcurrent(t *testing.T) {
	t.Parallel()
	m, err := NewMap([]MapOp{
		{Op: OpSet, Path: "PID-1", Value: "2"},
		{Op: OpCopy, From: "PID-5", Path: "NK1-2"},
	})
	if err != nil {
		t.Fatal(err)
	}
	in := parse(t, adt)
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 100 {
				out, err := m.Handle(context.Background(), in)
				if err != nil {
					t.Error(err)
					return
				}
				if got := out.Get("NK1-2.2"); got != "JANE" {
					t.Errorf("NK1-2.2 = %q", got)
					return
				}
			}
		})
	}
	wg.Wait()
	if got := string(in.Encode()); got != adt {
		t.Error("concurrent Handle changed the shared input")
	}
}
