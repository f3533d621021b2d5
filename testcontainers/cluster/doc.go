// Package cluster runs mefor as an operator does, for tests of any package:
// `mefor` processes built from this module (StartProc, RunMefor), and a
// multi-node cluster of them on one test database and one config (New).
//
// A Cluster's nodes hold one listener lease between them; a test starts
// nodes, kills or freezes them (Node.Kill, Node.Signal), cuts a node off from
// the database through a fault proxy (NewProxy, Proxy.Cut,
// Proxy.CutHoldingLaneLock, Proxy.Heal), and sends traffic that fails over
// between the nodes' ports as a real sending system does (StartTraffic). It
// then checks what the nodes' JSON logs, `mefor nodes` and the downstream
// Partner saw: no two nodes held the lease or a listener at once
// (AssertNoOverlap), and every acknowledged message was delivered in its
// lane's order (CheckDelivered).
//
// The timings are fast (Heartbeat, FenceTimeout, LeaseTTL), so a failover
// takes about two seconds.
//
// ServeMLLP serves a downstream system whose answers the test writes (a
// slow partner, one that rejects, one that quotes the patient), and ACK
// builds its acknowledgments.
//
// StartNode runs a node in the test's own process instead, for tests that
// drive the engine's options directly; Start does it with options exactly
// as the test gives them.
package cluster
