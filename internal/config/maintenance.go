package config

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
)

// Maintenance configures the periodic jobs River's elected leader enqueues
// and any node works: when each runs and with what settings.
type Maintenance struct {
	// Reclaim re-activates lanes whose drainer ended with backlog left and
	// frees the drainers of nodes that stopped heartbeating. It always runs.
	Reclaim ReclaimJob
	// Retention purges old message content and deletes old `error`
	// messages. It is never nil: without a maintenance.retention block it
	// only deletes `error` messages past KeepErrors' default, and purges
	// no content.
	Retention *Retention
	// AuditAnchor records the audit log's head, signed with
	// MEFOR_AUDIT_KEY, so a later `mefor audit verify` catches a rewritten
	// or cut log. It always runs.
	AuditAnchor AuditAnchorJob
}

// AuditAnchorJob is the audit_anchor job's settings.
type AuditAnchorJob struct {
	// Schedule defaults to every 15m.
	Schedule Schedule
}

// ReclaimJob is the reclaim job's settings.
type ReclaimJob struct {
	// Schedule defaults to every 5s.
	Schedule Schedule
}

// Retention says how long message content is kept. Bodies are nulled and the
// metadata kept (who sent what type when, where it went, what happened), so
// the message history stays searchable after the content is gone. A message
// with a row still pending is never touched.
type Retention struct {
	// Schedule defaults to every hour.
	Schedule Schedule
	// KeepBodies is how long after receipt a message's content is kept:
	// its raw body, the payloads of its finished stage rows, its event
	// details and its partners' replies.
	KeepBodies time.Duration
	// KeepDead is how long after its last dead letter a message that was
	// dead-lettered keeps its content, so it can still be replayed.
	// Defaults to KeepBodies, or to KeepErrors when the file sets a
	// shorter one.
	KeepDead time.Duration
	// KeepErrors is how long a message whose status is `error` (it did
	// not parse, or a delivery of it was dead-lettered) is kept at all:
	// it is deleted outright, metadata and all, this long after it failed
	// (its receipt, or its last dead letter). Never shorter than KeepDead.
	// Defaults to 30 days, or KeepDead when that is longer, even without a
	// retention block.
	KeepErrors time.Duration
	// KeepErrorsGiven says the file sets keep_errors (else KeepErrors is
	// its default).
	KeepErrorsGiven bool
	// DeleteAfter, when not zero, is how long after receipt a message is
	// deleted outright, metadata and all; never while a dead letter of it
	// is still inside KeepDead.
	DeleteAfter time.Duration
	// BatchSize is how many messages one purge transaction handles; each
	// batch is a short transaction, so intake never waits long on one.
	// Defaults to 5000.
	BatchSize int
	// KeepState, when not zero, is how long a transform state value is
	// kept after it was last written; zero keeps state forever.
	KeepState time.Duration
}

const (
	defaultReclaimInterval = 5 * time.Second
	// defaultAuditAnchorInterval bounds how many audit rows a database
	// superuser could rewrite unseen by a keyed verify: those since the
	// latest anchor.
	defaultAuditAnchorInterval = 15 * time.Minute
	defaultRetentionSchedule   = time.Hour
	defaultRetentionBatch      = 5000
	minRetentionBatch          = 10
	maxRetentionBatch          = 100_000
	// defaultKeepErrors bounds how long `error` messages stay when nobody
	// said: without a bound a sender of junk frames, or a partner that
	// rejects everything, grows the database without end. A month leaves
	// time to notice an alert or a weekly report, fix the cause and replay
	// the dead letters.
	defaultKeepErrors = 30 * 24 * time.Hour
)

func defaultMaintenance() Maintenance {
	return Maintenance{
		Reclaim:     ReclaimJob{Schedule: Every(defaultReclaimInterval)},
		Retention:   defaultRetention(),
		AuditAnchor: AuditAnchorJob{Schedule: Every(defaultAuditAnchorInterval)},
	}
}

// defaultRetention is the retention policy of a file without a
// maintenance.retention block: no content is purged, `error` messages are
// deleted after defaultKeepErrors.
func defaultRetention() *Retention {
	return &Retention{Schedule: Every(defaultRetentionSchedule), BatchSize: defaultRetentionBatch, KeepErrors: defaultKeepErrors}
}

func (l *loader) decodeMaintenance(n *yaml.Node, p path, mt *Maintenance) {
	m := l.mapping(n, p, "reclaim", "retention", "audit_anchor")

	rp := p.key("reclaim")
	rm := l.mapping(m["reclaim"], rp, "schedule")
	l.schedule(rm, rp, "schedule", &mt.Reclaim.Schedule)

	ap := p.key("audit_anchor")
	am := l.mapping(m["audit_anchor"], ap, "schedule")
	l.schedule(am, ap, "schedule", &mt.AuditAnchor.Schedule)

	if _, ok := m["retention"]; !ok {
		return
	}
	tp := p.key("retention")
	r := defaultRetention()
	tm := l.mapping(m["retention"], tp, "schedule", "keep_bodies", "keep_dead", "keep_errors", "delete_after", "batch_size", "keep_state")
	l.schedule(tm, tp, "schedule", &r.Schedule)
	decodeScalar(l, tm, tp, "keep_bodies", &r.KeepBodies, parseAge)
	decodeScalar(l, tm, tp, "keep_dead", &r.KeepDead, parseAge)
	decodeScalar(l, tm, tp, "keep_errors", &r.KeepErrors, parseAge)
	decodeScalar(l, tm, tp, "delete_after", &r.DeleteAfter, parseAge)
	decodeScalar(l, tm, tp, "batch_size", &r.BatchSize, parseInt)
	decodeScalar(l, tm, tp, "keep_state", &r.KeepState, parseAge)
	r.KeepErrorsGiven = l.given(tp.key("keep_errors"))
	if !l.given(tp.key("keep_dead")) {
		r.KeepDead = r.KeepBodies
		if r.KeepErrorsGiven && r.KeepErrors > 0 && r.KeepErrors < r.KeepDead {
			// A dead letter is deleted at keep_errors, content and all.
			r.KeepDead = r.KeepErrors
		}
	}
	if !r.KeepErrorsGiven && r.KeepDead > r.KeepErrors {
		// A dead letter is an `error` message: it must outlive its
		// keep_dead window to be replayable there.
		r.KeepErrors = r.KeepDead
	}
	mt.Retention = r
}

func (l *loader) checkMaintenance(mt Maintenance) {
	p := path{section: "maintenance"}
	if d, ok := mt.Reclaim.Schedule.Interval(); ok && d < time.Second {
		l.errorf(p.key("reclaim").key("schedule"), "%s is too often: reclaim reads every lane; use 1s or more (e.g. schedule: 5s)", fmtDuration(d))
	}
	if d, ok := mt.AuditAnchor.Schedule.Interval(); ok && d < time.Second {
		l.errorf(p.key("audit_anchor").key("schedule"), "%s is too often: each anchor is a row kept forever; use 1s or more (e.g. schedule: 15m)", fmtDuration(d))
	}
	r := mt.Retention
	p = p.key("retention")
	if r == nil || !l.given(p) {
		return
	}
	keep, dead, del, errs := p.key("keep_bodies"), p.key("keep_dead"), p.key("delete_after"), p.key("keep_errors")
	switch {
	case !l.given(keep) && !r.KeepErrorsGiven:
		l.errorf(keep, "is required: how long message bodies are kept after receipt (e.g. keep_bodies: 30d)")
	case !l.given(keep) && l.given(dead):
		l.errorf(keep, "is required with keep_dead: how long message bodies are kept after receipt (e.g. keep_bodies: 30d)")
	case !l.given(keep):
		// Only keep_errors: bodies are kept as without a block.
	case r.KeepBodies <= 0:
		l.errorf(keep, "must be > 0 (e.g. keep_bodies: 30d)")
	}
	if l.given(dead) && r.KeepDead <= 0 {
		l.errorf(dead, "must be > 0 (e.g. keep_dead: 90d), or left out to keep dead letters as long as other bodies")
	}
	if l.given(del) && !l.failed(del) {
		longest, what, name := r.KeepBodies, keep, "keep_bodies"
		if r.KeepDead > longest {
			longest, what, name = r.KeepDead, dead, "keep_dead"
		}
		if r.DeleteAfter <= 0 {
			l.errorf(del, "must be > 0 (e.g. delete_after: 365d), or left out to keep message metadata forever")
		} else if r.DeleteAfter < longest && !l.failed(what) {
			l.errorf(del, "(%s) is shorter than %s (%s): messages would be deleted while their content is meant to be kept; make it at least %s",
				fmtAge(r.DeleteAfter), name, fmtAge(longest), fmtAge(longest))
		}
	}
	if r.KeepErrorsGiven && !l.failed(errs) {
		switch {
		case r.KeepErrors <= 0:
			l.errorf(errs, "must be > 0 (e.g. keep_errors: 30d): `error` messages are never kept forever by default")
		case r.KeepErrors < r.KeepDead && !l.failed(dead):
			l.errorf(errs, "(%s) is shorter than keep_dead (%s): dead letters would be deleted while they are meant to stay replayable; make it at least %s",
				fmtAge(r.KeepErrors), fmtAge(r.KeepDead), fmtAge(r.KeepDead))
		}
	}
	if ks := p.key("keep_state"); l.given(ks) && !l.failed(ks) && r.KeepState <= 0 {
		l.errorf(ks, "must be > 0 (e.g. keep_state: 400d), or left out to keep transform state forever")
	}
	if r.BatchSize < minRetentionBatch || r.BatchSize > maxRetentionBatch {
		l.errorf(p.key("batch_size"), "must be from %d to %d messages (e.g. batch_size: %d): bigger batches hold their locks longer",
			minRetentionBatch, maxRetentionBatch, defaultRetentionBatch)
	}
}

// parseAge parses how long something is kept: a duration such as 36h, or a
// whole number of days such as 30d, since retention windows are spoken of in
// days and Go durations have no day unit.
func parseAge(s string) (time.Duration, error) {
	if days, ok := strings.CutSuffix(s, "d"); ok {
		n, err := strconv.Atoi(days)
		if err != nil || n < 0 {
			return 0, fmt.Errorf("%q is not a number of days; write a whole number such as 30d, or a duration such as 36h", s)
		}
		if n > 100*365 {
			return 0, fmt.Errorf("%q is more than a century; leave the setting out to keep forever", s)
		}
		return time.Duration(n) * 24 * time.Hour, nil
	}
	d, err := parseDuration(s)
	if err != nil {
		return 0, fmt.Errorf("%w, or a number of days such as 30d", err)
	}
	return d, nil
}

// fmtAge formats a retention window as parseAge reads it: whole days as
// 30d, anything else as a duration.
func fmtAge(d time.Duration) string {
	if d > 0 && d%(24*time.Hour) == 0 {
		return strconv.FormatInt(int64(d/(24*time.Hour)), 10) + "d"
	}
	return fmtDuration(d)
}
