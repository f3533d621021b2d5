-- The audit trail off the box.

-- How far each audit.forward target (syslog, webhook) has sent the audit
-- log: the last row (mefor_audit.seq) and the last anchor
-- (mefor_audit_anchor.no) its receiver accepted. Forwarding resumes after
-- them, so every row and anchor is sent at least once and in order, and
-- the targets progress independently. Written only by package
-- auditforward, by the node working the audit-forward job.
CREATE TABLE mefor_audit_forward (
    target      text        PRIMARY KEY,
    audit_seq   bigint      NOT NULL DEFAULT 0 CHECK (audit_seq >= 0),
    anchor_no   bigint      NOT NULL DEFAULT 0 CHECK (anchor_no >= 0),
    -- When the receiver last accepted a batch, and the last failure since
    -- (its error text names the receiver, never audit content).
    sent_at     timestamptz,
    failed_at   timestamptz,
    last_error  text,
    updated_at  timestamptz NOT NULL DEFAULT clock_timestamp()
);
