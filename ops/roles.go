package ops

import "github.com/mefor/mefor/migrations"

// Operation names an operator operation for the role policy. The CLI, the
// API and the console ask RequiredRole which database role each needs, so
// they explain a refusal the same way.
type Operation string

// Operations that need more than RoleReader. Any other operation needs
// RoleReader.
const (
	OpMessagesShowBody Operation = "messages-show-body"
	OpMessagesSearch   Operation = "messages-search-bodies"
	// OpMessagesPatient is messages list --patient.
	OpMessagesPatient Operation = "messages-search-patient"
	OpReplay          Operation = "replay"
	OpReplayDead      Operation = "replay-dead"
	OpCancel          Operation = "cancel"
	OpEnqueue         Operation = "enqueue"
	OpReferenceShow   Operation = "reference-show"
	OpRun             Operation = "run"
	OpStepdown        Operation = "stepdown"
	OpReload          Operation = "reload"
	OpMaintenanceRun  Operation = "maintenance-run"
	OpReferenceSync   Operation = "reference-sync"
	OpMigrate         Operation = "migrate"
	OpKeysRotate      Operation = "keys-rotate"
	// OpUsers and OpTokens are mefor user and mefor token: the identity
	// tables are readable by admins only.
	OpUsers  Operation = "users"
	OpTokens Operation = "tokens"
)

// RoleReader, RoleOperator and RoleAdmin are the database roles an
// administrator grants (migrations.Roles); each includes the one before.
const (
	RoleReader   = migrations.RoleReader
	RoleOperator = migrations.RoleOperator
	RoleAdmin    = migrations.RoleAdmin
)

// requiredRoles is the role policy: reading content and changing the
// pipeline is for operators, running and reconfiguring the cluster for
// admins. The database enforces it through the grants; this table only
// names the role when the database refuses.
var requiredRoles = map[Operation]string{
	OpMessagesShowBody: RoleOperator,
	OpMessagesSearch:   RoleOperator,
	OpMessagesPatient:  RoleOperator,
	OpReplay:           RoleOperator,
	OpReplayDead:       RoleOperator,
	OpCancel:           RoleOperator,
	OpEnqueue:          RoleOperator,
	OpReferenceShow:    RoleOperator,
	OpRun:              RoleAdmin,
	OpStepdown:         RoleAdmin,
	OpReload:           RoleAdmin,
	OpMaintenanceRun:   RoleAdmin,
	OpReferenceSync:    RoleAdmin,
	OpMigrate:          RoleAdmin,
	OpKeysRotate:       RoleAdmin,
	OpUsers:            RoleAdmin,
	OpTokens:           RoleAdmin,
}

// RequiredRole returns the least role that may run op. Defaults to
// RoleReader for an operation the policy does not name.
func RequiredRole(op Operation) string {
	if r, ok := requiredRoles[op]; ok {
		return r
	}
	return RoleReader
}

// IsPermissionDenied reports whether err is the database refusing an
// operation for lack of privilege; RequiredRole names the role to grant.
func IsPermissionDenied(err error) bool { return migrations.IsPermissionDenied(err) }
