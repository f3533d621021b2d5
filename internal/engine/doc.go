// Package engine runs a mefor node: it compiles the config into the graph
// the drainers use, receives messages on the inbound listeners, and owns the
// River client working the stage queues.
//
// # Polling
//
// Each River producer looks for available jobs without being notified at
// its queue's fetch poll interval (stageQueuePoll, slowQueuePoll); each look
// is a database transaction, so at idle these are most of a node's database
// load (docs/ARCHITECTURE.md, "Idle cost").
//
// River's notifications cover inserts and the jobs its scheduler makes
// available. A drainer's yield (a snooze of zero) and its short snoozes (a
// delivery retry, a held row) are announced by the node's snooze waker
// (snoozewake.go), once River has recorded them, so on the stage queues
// the poll is only the backstop for a notification lost, and it is River's
// default. Were they announced by the poll alone, it would have to be
// short, and the three stage queues' polls would be most of an idle node's
// transactions and of its CPU.
//
// The maintenance and alert jobs are inserted by River's periodic enqueuer
// (which notifies) or retried with River's own backoff, so there the poll
// only bounds how late a retry shorter than 5s runs, and a slow one costs
// little.
package engine
