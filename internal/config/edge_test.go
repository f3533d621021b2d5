package config_test

import "testing"

// Who may connect to a listener, and how many at once: each bad value is
// refused with where it is and what to write.
func TestListenerAdmissionValidation(t *testing.T) {
	checkInvalid(t, "", []invalid{
		{
			name: "bad allow entries and caps",
			doc: `channels:
  adt:
    inbound:
      mllp:
        listen: 127.0.0.1:2575
        allow:
          - lab.example.org
          - 10.1.2.3/8
          - 10.1.2.3:2575
          - 10.20.0.0/16
        max_connections: 0
        max_connections_per_ip: many
    routes: [{destinations: [out]}]
destinations:
  out: {type: mllp, mllp: {address: 127.0.0.1:2576}}
`,
			want: []wantErr{
				{7, "channels.adt.inbound.mllp.allow[0]", `"lab.example.org" is a host name; names are not allowed here`},
				{8, "channels.adt.inbound.mllp.allow[1]", "did you mean 10.0.0.0/8?"},
				{9, "channels.adt.inbound.mllp.allow[2]", "has a port"},
				{11, "channels.adt.inbound.mllp.max_connections", "must be at least 1"},
				{12, "channels.adt.inbound.mllp.max_connections_per_ip", `"many" is not a whole number`},
			},
		},
		{
			name: "empty allow",
			doc: `channels:
  adt:
    inbound:
      mllp:
        listen: 127.0.0.1:2575
        allow: []
        max_connections_per_ip: 0
    routes: [{destinations: [out]}]
destinations:
  out: {type: mllp, mllp: {address: 127.0.0.1:2576}}
`,
			want: []wantErr{
				{6, "channels.adt.inbound.mllp.allow", "is empty, so no sender could connect"},
				{7, "channels.adt.inbound.mllp.max_connections_per_ip", "must be at least 1"},
			},
		},
	})
}
