// Package syslog is mefor's syslog client: RFC 5424 messages sent over TCP,
// in plaintext or TLS (RFC 5425), each framed by octet counting (RFC 6587:
// its length in decimal, a space, the message), one connection per send.
// The audit trail's forwarding (package auditforward) and the alert sinks
// (package notify) both send through it.
//
// # What "accepted" means
//
// Syslog over TCP has no application-level acknowledgement: a write that
// succeeded only put the bytes in the kernel's buffer. After writing, the
// client closes its side of the stream (a TLS close_notify, or a TCP FIN)
// and waits for the receiver to close its own; a receiver reads its stream
// in order, so seeing the close means it read every frame before it. It
// does not mean the receiver stored them. Receivers that keep the
// connection open make the send fail after its timeout; Client.NoConfirm
// is for them.
package syslog
