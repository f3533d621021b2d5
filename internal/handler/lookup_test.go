package handler

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
)

// table is a Lookup over fixed sets; a set absent from it has no snapshot.
type table map[string]map[string]string

func (t table) Lookup(set, key, column string) (string, bool, error) {
	rows, ok := t[set]
	if !ok {
		return "", false, fmt.Errorf("reference set %q has no snapshot: %w", set, ErrNotReady)
	}
	if column != "" && column != "loinc" {
		return "", false, fmt.Errorf("reference set %q has no column %q", set, column)
	}
	v, ok := rows[key]
	return v, ok, nil
}

const labResult = "MSH|^~\\&|LAB|HOSP|EHR|HOSP|20240101120000||ORU^R01|MSG2|P|2.5.1\r" +
	"PID|1||123^^^HOSP^MR\r" +
	"OBX|1|NM|GLU^Glucose^L||5.4|mmol/L\r" +
	"OBX|2|NM|NA^Sodium^L||140|mmol/L\r" +
	"OBX|3|NM|XYZ^Unknown^L||1|U\r" +
	"OBX|4|NM|||2|U\r"

func TestLookupOp(t *testing.T) {
	t.Parallel()
	codes := table{"lab-codes": {"GLU": "2345-7", "NA": "2951-2"}}
	obx3 := func(t *testing.T, op MapOp) ([]string, error) {
		t.Helper()
		m, err := NewMap([]MapOp{op}, WithLookup(codes))
		if err != nil {
			t.Fatal(err)
		}
		out, err := m.Handle(context.Background(), parse(t, labResult))
		if err != nil {
			return nil, err
		}
		var got []string
		for i := 1; i <= 4; i++ {
			got = append(got, out.Get(fmt.Sprintf("OBX(%d)-3", i)))
		}
		return got, nil
	}

	got, err := obx3(t, MapOp{Op: OpLookup, From: "OBX-3.1", Set: "lab-codes", OnMiss: MissKeep})
	if err != nil {
		t.Fatal(err)
	}
	// Every OBX is translated, a miss keeps its code, an empty code stays empty.
	want := []string{"2345-7^Glucose^L", "2951-2^Sodium^L", "XYZ^Unknown^L", ""}
	if strings.Join(got, "|") != strings.Join(want, "|") {
		t.Errorf("keep: OBX-3s %q, want %q", got, want)
	}

	got, err = obx3(t, MapOp{Op: OpLookup, From: "OBX-3.1", Path: "OBX-3.3", Set: "lab-codes", OnMiss: MissDefault, Default: "UNMAPPED"})
	if err != nil {
		t.Fatal(err)
	}
	want = []string{"GLU^Glucose^2345-7", "NA^Sodium^2951-2", "XYZ^Unknown^UNMAPPED", ""}
	if strings.Join(got, "|") != strings.Join(want, "|") {
		t.Errorf("default into another component: OBX-3s %q, want %q", got, want)
	}

	// A single occurrence named explicitly is the only one touched.
	got, err = obx3(t, MapOp{Op: OpLookup, From: "OBX(2)-3.1", Set: "lab-codes"})
	if err != nil {
		t.Fatal(err)
	}
	if got[0] != "GLU^Glucose^L" || got[1] != "2951-2^Sodium^L" {
		t.Errorf("explicit occurrence: OBX-3s %q", got)
	}

	// dead-letter (the default policy) names the field and the set, not the code.
	_, err = obx3(t, MapOp{Op: OpLookup, From: "OBX-3.1", Set: "lab-codes"})
	if err == nil || !strings.Contains(err.Error(), `OBX(3)-3.1: the value is not in reference set "lab-codes"`) {
		t.Fatalf("dead-letter miss: %v", err)
	}
	if strings.Contains(err.Error(), "XYZ") {
		t.Errorf("miss error quotes the code: %v", err)
	}
	if errors.Is(err, ErrNotReady) {
		t.Errorf("a miss must not be retried: %v", err)
	}

	// A set without a snapshot is retried, not dead-lettered.
	_, err = obx3(t, MapOp{Op: OpLookup, From: "OBX-3.1", Set: "other"})
	if !errors.Is(err, ErrNotReady) {
		t.Errorf("set without snapshot: %v, want ErrNotReady", err)
	}
}

func TestLookupOpErrors(t *testing.T) {
	t.Parallel()
	codes := table{}
	for _, tt := range []struct {
		op   MapOp
		opts []MapOption
		want string
	}{
		{MapOp{Op: OpLookup, From: "OBX-3.1", Set: "s"}, nil, "none were given"},
		{MapOp{Op: OpLookup, From: "OBX-3.1"}, []MapOption{WithLookup(codes)}, "needs a set"},
		{MapOp{Op: OpLookup, Set: "s"}, []MapOption{WithLookup(codes)}, "needs from"},
		{MapOp{Op: OpLookup, From: "MSH-2", Set: "s"}, []MapOption{WithLookup(codes)}, "cannot be written"},
		{MapOp{Op: OpLookup, From: "OBX-3.1", Set: "s", OnMiss: "drop"}, []MapOption{WithLookup(codes)}, `unknown on_miss "drop"`},
		{MapOp{Op: OpLookup, From: "OBX-3.1", Set: "s", Default: "x"}, []MapOption{WithLookup(codes)}, "default only applies"},
	} {
		if _, err := NewMap([]MapOp{tt.op}, tt.opts...); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("NewMap(%+v) = %v, want an error containing %q", tt.op, err, tt.want)
		}
	}
}
