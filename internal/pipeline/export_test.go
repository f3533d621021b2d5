package pipeline

// DeadLetterOrphansInChunks is DeadLetterOrphans with the chunk given, so a
// test can span several chunks without a million rows.
var DeadLetterOrphansInChunks = deadLetterOrphans
