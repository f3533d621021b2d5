package config_test

import (
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/mefor/mefor/internal/identity"
)

// access.approvals names permissions of actions, and an expiry; a read
// permission, an unknown name or a non-positive expiry is refused naming
// the item.
func TestAccessApprovals(t *testing.T) {
	doc := func(access string) string {
		return `
channels:
  adt:
    inbound: {mllp: {listen: 127.0.0.1:2575}}
    routes: [{destinations: [out]}]
destinations:
  out: {type: mllp, mllp: {address: 127.0.0.1:2576}}
access:
` + access
	}
	for _, tt := range []struct {
		access string
		field  string
		says   string
	}{
		{access: "  approvals: {required_for: [replay-dead, cancel, stepdown, keys.rotate]}\n"},
		{access: "  approvals: {required_for: [replay-dead, messages.read]}\n", field: "access.approvals.required_for[1]", says: "is a permission to read"},
		{access: "  approvals: {required_for: [replay-deadd]}\n", field: "access.approvals.required_for[0]", says: "is not a permission"},
		{access: "  approvals: {required_for: [cancel], expire: 0s}\n", field: "access.approvals.expire", says: "must be > 0"},
		{access: "  approval: {}\n", field: "access", says: "approval"},
	} {
		_, err := parse(t, doc(tt.access), nil)
		if tt.field == "" {
			if err != nil {
				t.Errorf("%q: %v", tt.access, err)
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), tt.field) || !strings.Contains(err.Error(), tt.says) {
			t.Errorf("%q: %v, want an error at %s saying %q", tt.access, err, tt.field, tt.says)
		}
	}
	c, err := parse(t, doc("  approvals: {required_for: [replay-dead]}\n"), nil)
	if err != nil {
		t.Fatal(err)
	}
	a := c.Access.Approvals
	if a == nil || a.Expire != 24*time.Hour || !reflect.DeepEqual(a.RequiredFor, []identity.Permission{identity.PermReplayDead}) {
		t.Fatalf("access.approvals: %+v", a)
	}
}
