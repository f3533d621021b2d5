// Package pipeline owns the pipeline's tables: mefor_message, mefor_work,
// mefor_event, mefor_response, mefor_state, mefor_intake_file,
// mefor_destination_layout and the status counts (mefor_message_count,
// mefor_work_count). No other package writes them. It holds intake, the
// finalizer, the operator's writes (replay, cancel and enqueue, each a call
// of a SECURITY DEFINER function of migration 024 that holds their SQL,
// since operators may not write these tables), orphan dead-lettering,
// the destinations' lane layouts, stored transform state, the statements
// retention and key rotation run, and the drainer's side of the lane
// protocol: reading a lane, proving an execution is still the one River
// runs (the fence), and the hand-offs that move rows to the next stage or
// record a delivery, each in one round trip. Every function that changes
// pipeline state takes the caller's transaction, so what it writes commits
// as one unit with the caller's other writes.
//
// # Model
//
// A lane is one stage's ordered backlog for one name: ingress:<channel>,
// routed:<channel>, outbound:<destination>[~<generation>][#<partition>].
// Rows carry a seq drawn under the lane's transaction lock, so seq order is
// commit order, and a lane is served strictly in seq order. Each lane has at
// most one live drainer in the whole cluster: a River job unique by lane
// (package jobs), which producers activate in the transaction that writes
// the row (jobs.LockLanes, jobs.Activate).
//
// A drainer execution reads its lane head first (PendingRows), decides what
// to do with the rows (route them, transform them, send the head), and hands
// off in one transaction per step: the consumed rows, the produced rows,
// events, the finalizer and the lane activations commit together or not at
// all. Everything a hand-off produces is tied, in the statement that
// consumes, to the rows it actually consumed: a row someone else ended
// meanwhile (an operator's cancel or an orphan sweep) yields nothing, and a
// transform hand-off whose rows wrote transform state rolls back with a
// StateConflict instead of leaving the writes of a row it did not consume
// (state.go). An
// execution ends in one of three ways: the lane is empty (CompleteIfEmpty,
// under the lane lock a producer also takes, then river.JobCompleteTx in the
// same transaction), its time slice is used up (it snoozes for zero), or
// its head must wait (it snoozes until the head is due: nothing behind a
// failing head overtakes it).
//
// # The execution and the fence
//
// River stamps attempted_at each time it fetches a job; a snooze gives the
// attempt number back, so two executions can share it, but never the
// stamp. An Execution is the job id and that stamp. Every hand-off's batch
// starts with the fence: it finds the job row only while it is running with
// that stamp and locks it until the transaction ends, so a rescue cannot
// slip in before the commit. A superseded execution gets ErrSuperseded,
// its transaction rolls back, and it stops without touching its lane again.
//
// # Hand-offs of several drainers in one transaction
//
// Route and transform hand-offs and delivery records can be prepared
// (PrepareRoute, PrepareTransform, PrepareRecord) and sent together
// (RunHandoffs): one fence statement
// proves every execution running and locks their job rows in id order, the
// lanes they write are locked together in sorted order, and each statement
// carries every participant's rows. It commits for all or none: with one
// execution superseded it fails with ErrSuperseded, and the caller commits
// each hand-off again alone, where only that one is refused. Each lane keeps
// its order because its one drainer waits for its hand-off before it reads
// the lane again, or sends on it again. The records of several lanes are
// one statement, which answers each lane on its own (Handoff.Recorded):
// its rows found pending and its cancel marks. A hand-off with transform
// state is never shared (its key locks follow its consume), nor is a
// record with a failed attempt or a routed reply (Handoff.Shareable).
// workers.Handoffs decides who shares.
//
// # Trust window
//
// The fence makes every write safe, not every send: a send happens outside
// any transaction. Between the drainer's last successful transaction and
// its next one, the cluster may hand the lane on: River's rescuer after
// RescueStuckJobsAfter, or reclaim once the node has been silent past its
// node_timeout. A drainer therefore checks, right before each send, that its
// node's last confirmed heartbeat is younger than node_timeout minus a
// heartbeat, and stops with ErrNodeNotAlive otherwise. What remains is the
// send in flight when the node froze, and the sends before it whose
// outcomes were not recorded yet: a drainer records its sends in windows
// (RecordAttempts; the destination's record_batch), at most rows sends
// each, the one in flight included. They may reach the partner after the
// lane moved, and are sent again by the new execution. At most
// record_batch rows deliveries per lane can be duplicated this way; order
// is never broken.
//
// # Failure cases
//
//   - The node crashes mid-send: the job is rescued and the next execution
//     sends the unrecorded sends of the lost window again, head first (at
//     least once). It first records a "crashed"
//     attempt against the head when the head was due at the rescue, so a
//     message that crashes the node every time is dead-lettered after
//     max_attempts crashes instead of blocking the lane forever (see
//     workers/rescue.go for how an execution knows it follows a death).
//   - An operator cancels while the drainer is running: the rows are marked,
//     not cancelled (CancelBatch), because the drainer may be sending
//     one. RecordAttempt reports marks in its round trip and the drainer
//     cancels them (CancelMarked) before sending anything else; a marked
//     row it reads is cancelled instead of sent; the row it was sending is
//     recorded as the partner answered.
//   - A destination's ordering changes: rows queued under the old layout
//     stay in their lanes; lanes of the new layout generation hold their
//     rows (Row.Held) while an older-generation lane of the destination has
//     a lower seq pending, so per-key order survives the change.
//   - The row's channel, route, handler or destination is not in this
//     node's config: it is dead-lettered (DeadLetter) only when the cluster
//     agrees on that config; otherwise the drainer yields the lane untouched
//     to a node that knows it.
//
// # Lock order
//
// Every writer takes locks in one order: a drainer's river_job row (its
// fence; operators that must know whether a drainer is running lock the
// job rows in id order), then lane locks (sorted by name), then work rows
// (id order), then message finalize locks (id order). Whoever skips a level
// skips it, never reverses two.
package pipeline
