// Package cpupressure tells whether this host's CPUs are contended, from
// Linux's pressure stall information: the share of time in which at least
// one runnable task waited for a CPU (the "some" line of /proc/pressure/cpu).
//
// # Defaults
//
// A window of DefaultWindow follows a change of load within a few wakes of
// a drainer. The thresholds were chosen with the benchmark on a 2-core host
// running the node and PostgreSQL side by side. A sender as fast as its
// ACKs puts the share above DefaultOn there, and a lightly paced one stays
// below DefaultOff; with a higher On, a host that is short of CPU is read
// as busy only part of the time, so its drainers gather only part of the
// time and commit more transactions per message than gathering gives.
// Lanes too light to expect company within a gather never gather whatever
// the gauge says (workers.Limits.Gather), so a low threshold costs a light
// load nothing.
package cpupressure
