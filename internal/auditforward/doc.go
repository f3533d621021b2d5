// Package auditforward sends the audit trail off the box: every row of
// mefor_audit and every anchor of mefor_audit_anchor, to a syslog receiver
// (RFC 5424 over TLS, octet-counted framing, RFC 5425/6587) and/or a
// webhook (HTTPS POST of JSON batches), as audit.forward configures.
//
// # Model
//
// Each target has a cursor in mefor_audit_forward, written only here: the
// last audit row (seq) and the last anchor (no) its receiver accepted. A
// run reads a batch after the cursor (rows in seq order, each anchor placed
// after the row it covers), sends it, and only once the receiver accepted
// it advances the cursor, with a compare-and-set on the values it read, so
// the cursor never moves back and never past what was sent. A batch that
// fails is sent again, whole, with backoff: rows reach the receiver at
// least once and in order, and a receiver that was down gets everything
// it missed, with no gap, when it is back.
//
// Runs are River jobs on the maintenance queue, enqueued by River's
// elected leader (workers.AuditForwardWorker) and unique while live, so
// one node sends at a time. A run is bounded (30s, retries included) well
// under River's rescue of stuck jobs, so River does not start another
// while it sends; a node that froze mid-run and wakes after its job was
// rescued may still send a batch the next run sends again: a duplicate,
// never a gap (the compare-and-set refuses its stale advance).
//
// # What "accepted" means
//
// A webhook accepts a batch by answering 2xx. Syslog over TCP has no
// application-level acknowledgement: a write that succeeded only put the
// bytes in the kernel's buffer. After writing a batch the sender closes its
// side of the TLS stream (close_notify) and waits for the receiver to close
// its own; a receiver reads its stream in order, so seeing the close means
// it read every frame before it. It does not mean the receiver stored
// them: a receiver that crashes after reading and before writing loses
// them, and no TCP syslog client can tell. Receivers that keep the
// connection open after close_notify make the batch fail after Timeout;
// set syslog.confirm: false for them, and the cursor then advances once
// the write succeeded.
//
// Rows hold ids, actors, actions and outcomes, never message content
// (package audit), so nothing forwarded is content either.
package auditforward
