package config

import "time"

// RecordBatch bounds how a destination lane's delivery outcomes are
// recorded. Sends stay one at a time and in order; their outcomes may be
// written in one transaction per window, which closes after Rows sends or
// once Window has passed since its first send, whichever comes first (and
// at any failure, cancel or stop). A crash repeats at most the sends of
// the open window: at most Rows duplicates per lane per crash. Rows: 1
// records every send in its own transaction.
type RecordBatch struct {
	// Rows is the most sends one record transaction covers, and so the
	// most a crash can make the lane send twice. Defaults to 32.
	Rows int
	// Window is the longest a send waits for its record once a send of
	// its window went out; a delivery is finalized at most this late.
	// Defaults to 5ms.
	Window time.Duration
}

const (
	defaultRecordRows   = 32
	defaultRecordWindow = 5 * time.Millisecond
	// maxRecordRows keeps the crash duplicate bound (and a record's
	// batch) small.
	maxRecordRows = 1000
	// maxRecordWindow keeps a delivery's record, its finalizing and its
	// routed reply from lagging behind the send by much.
	maxRecordWindow = time.Second
)

func (l *loader) checkRecordBatch(r RecordBatch, p path) {
	if (r.Rows < 1 || r.Rows > maxRecordRows) && !l.failed(p.key("rows")) {
		l.errorf(p.key("rows"), "must be from 1 to %d: how many sends one record transaction covers, and so how many a crash may repeat; 1 records each send on its own (e.g. rows: %d)", maxRecordRows, defaultRecordRows)
	}
	if (r.Window <= 0 || r.Window > maxRecordWindow) && !l.failed(p.key("window")) {
		l.errorf(p.key("window"), "must be > 0 and at most %s: how long a send may wait for its record (e.g. window: %s)", fmtDuration(maxRecordWindow), fmtDuration(defaultRecordWindow))
	}
}
