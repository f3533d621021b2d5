package engine

// SetCommitHook makes in report the size of each intake batch as its
// commit starts.
func SetCommitHook(in *Intake, f func(messages int)) { in.onCommit = f }
