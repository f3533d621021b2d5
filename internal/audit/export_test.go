package audit

// RowHash is the chain's hash, for tests that write rows as a release
// before migration 019 did (the client computed it) or as an attacker would.
var RowHash = rowHash
