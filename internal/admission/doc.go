// Package admission decides which connections a listener admits: the
// source addresses it accepts (Sources), the connections it holds at once,
// in all and per source address (Gate), and, on a TLS listener, the client
// certificates it accepts beyond their CA's signature: by name, and not
// revoked (PeerCheck).
//
// A Gate wraps a net.Listener, so any server built on one (the MLLP
// listener, an HTTP listener) gets the same rules by serving on the
// wrapped listener: a connection from a source not allowed, or over a cap,
// is closed as soon as it is accepted, before a byte of it is read. Each
// refusal is counted (Options.Refused) and logged with the remote address,
// at most once per source per minute, so a sender that reconnects in a
// loop cannot flood the log.
//
// Nothing here reads message content: refusals name addresses, reasons
// and certificate names only.
package admission

// Reason is why a connection was refused. The set is small and fixed, so
// that it can label a metric.
type Reason string

// The reasons a connection is refused.
const (
	// NotAllowed: the source address is not in the listener's allow list.
	NotAllowed Reason = "not_allowed"
	// MaxConnections: the listener already holds max_connections.
	MaxConnections Reason = "max_connections"
	// MaxConnectionsPerIP: the listener already holds
	// max_connections_per_ip from this source address.
	MaxConnectionsPerIP Reason = "max_connections_per_ip"
	// TLSName: the client certificate verified, but none of its names is
	// in the listener's allow_names.
	TLSName Reason = "tls_name"
	// TLSRevoked: the client certificate, or one of its issuers, is listed
	// in the listener's certificate revocation list.
	TLSRevoked Reason = "tls_revoked"
	// TLSHandshake: any other failed TLS handshake (no certificate, one
	// from another CA, expired, plaintext spoken to a TLS port, ...).
	TLSHandshake Reason = "tls_handshake"
)

// Reasons lists every reason, in documentation order.
func Reasons() []Reason {
	return []Reason{NotAllowed, MaxConnections, MaxConnectionsPerIP, TLSName, TLSRevoked, TLSHandshake}
}
