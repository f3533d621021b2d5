// Package leader holds the cluster's shared state about nodes: membership
// (each node's heartbeat row), the listener lease that decides which node
// binds the inbound listeners, planned failover (stepdown) through operator
// requests, and the cluster config version with what each node applied. It
// is the only package that queries mefor_node, mefor_leader_lease,
// mefor_control_request, mefor_stepdown_audit and mefor_cluster_config.
//
// # Membership
//
// Every node upserts its row at start (recording its heartbeat and
// node_timeout) and refreshes last_seen every heartbeat, on the database
// clock; a clean stop marks it left. Each node is judged by the timings it
// recorded, in two SQL fragments every query uses (nodes.go): stale is
// missing more than two of its heartbeats (shown, not acted on), dead is
// having left or being silent past its node_timeout. The others hand a dead
// node's lanes on (reclaim) and end its database sessions, found by the
// application_name every node gives them (ApplicationName), so locks it
// holds come free.
//
// # The lease
//
// One row per leased duty (today the listeners) names the owner and an
// expiry on the database clock, so clock skew between nodes never decides
// who holds it. The holder renews every heartbeat; another node may take the
// row only once it has expired by the database clock.
//
// # Trust window and self-fence
//
// The holder trusts its lease for FenceTimeout after the last renewal it
// saw confirmed, counted from when that renewal was sent, on its own
// monotonic clock. A watchdog that does no I/O closes the gate when that
// time passes, and Serving checks the age itself, so a process resuming
// from a freeze answers false before any goroutine has run. NewLease
// refuses timings other than Heartbeat < FenceTimeout < TTL: the gate
// closes before the lease can expire, so two nodes never serve at once
// even when the database is unreachable and a renewal is stuck in flight.
// Intake re-checks the lease row inside the transaction that stores a
// message (QueueLeaseCheck, in the same batch; it raises in the database, so
// it refuses in an implicit transaction too), so a node that lost the lease
// cannot acknowledge anything once another node may be listening.
// The lease's self-fence is not the drainers' fence (package drainer): the
// lease decides who listens, the drainer fence who writes a lane.
//
// # Stepdown
//
// A stepdown (an operator request, answered by the addressed node) takes
// the maintenance lock the renewal tick also takes, bounded by
// FenceTimeout; closes the gate before any write; arms a claim pause of two
// heartbeats before the release write, so a cancelled request still keeps
// the node from re-claiming, and again after the write returns, so a slow
// write does not use it up; drains the listeners; writes the release. A
// release write that did not return is a refusal, never a success: the node
// remembers it owes the write, and a retry sends it again. Every answer is
// audited with what actually happened.
//
// # Failure cases
//
//   - The holder is killed: its lease expires after TTL; a standby takes it
//     at its next heartbeat.
//   - The holder freezes or is cut off: its gate closes within FenceTimeout
//     on its own clock, before the TTL lets another node in; intake's
//     in-transaction check refuses anything it still had in hand.
//   - A node's database round trips stall: Membership.Fresh tells its
//     drainers to stop sending before the others may count it dead.
package leader
