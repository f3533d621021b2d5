-- A cancel that meets a lane whose drainer is running marks the rows instead
-- of cancelling them: the drainer may be sending one of them right now, and
-- only it knows which. The drainer (the lane's only writer) resolves the
-- marks: a row it has not sent is cancelled, one it sent is recorded as
-- delivered. The partial index keeps the drainer's "any marks?" probe free
-- while nothing is marked.
ALTER TABLE mefor_work ADD COLUMN cancel_requested_at timestamptz;
CREATE INDEX mefor_work_cancel_requested ON mefor_work (lane)
    WHERE cancel_requested_at IS NOT NULL AND status = 'pending';
