// Package mllp implements the Minimal Lower Layer Protocol used to carry HL7
// v2 messages over TCP: the framing, a server that hands each received
// message to a Handler and writes back the acknowledgement it returns, and a
// client that sends a message and waits for its acknowledgement.
//
// The package is pure transport. It moves bytes and never interprets them:
// building and reading acknowledgements is left to callers, through
// Handler, Server.OnOversize and the bytes returned by Client.Send.
//
// Both sides speak MLLP over TLS when asked to (Server.TLSConfig,
// TLSDialer): the handshake, and with it the verification of the peer's
// certificate, completes before any frame is read or written.
//
// Message contents are protected health information. Nothing in this package
// puts message bytes into a log record or an error string; logs carry remote
// addresses, sizes and durations only.
package mllp
