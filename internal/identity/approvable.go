package identity

import "slices"

// Approvable are the permissions whose actions access.approvals may put
// under dual control: the ones that change something. Reads are not.
var Approvable = []Permission{PermReplay, PermReplayDead, PermCancel, PermEnqueue, PermStepdown, PermReload,
	PermMaintenanceRun, PermKeysRotate, PermUsers, PermTokens}

// IsApprovable reports whether p is in Approvable.
func IsApprovable(p Permission) bool { return slices.Contains(Approvable, p) }
