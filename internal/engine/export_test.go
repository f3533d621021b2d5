package engine

// SetCommitHook makes in report the size of each intake batch as its
// commit starts.
func SetCommitHook(in *Intake, f func(messages int)) { in.onCommit = f }

// QueuedIntake is how many messages wait for the intake commit in flight.
func QueuedIntake(in *Intake) int { return in.group.g.Waiting() }

// WaitingHandoffs is how many route and transform hand-offs of n wait for
// the one in flight.
func WaitingHandoffs(n *Node) int {
	if n.handoffs == nil {
		return 0
	}
	return n.handoffs.Waiting()
}

// SetHandoffHook makes each hand-off turn's leader of n call f, before it
// commits, with the number of hand-offs of its turn.
func SetHandoffHook(n *Node, f func(handoffs int)) { n.handoffs.SetHook(f) }

// WaitingReads is how many lane reads of n wait for the one in flight.
func WaitingReads(n *Node) int {
	if n.reads == nil {
		return 0
	}
	return n.reads.Waiting()
}

// SetReadHook makes each lane read turn's leader of n call f, before it
// reads, with the number of lanes of its turn (nothing with ReadsAlone).
func SetReadHook(n *Node, f func(reads int)) {
	if n.reads != nil {
		n.reads.SetHook(f)
	}
}
