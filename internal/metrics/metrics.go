// Package metrics holds a node's Prometheus metrics: the counters and
// histograms incremented where messages are received and delivered, the
// cluster gauges read from the database at scrape time, and the node's own
// gauges. Every node has its own registry (never the client library's
// global one), served on the admin listener's GET /metrics.
//
// Counters and histograms are per node, as Prometheus expects: sum them
// across nodes in a query. The cluster gauges (queue depth, oldest queued
// age, stage backlog) describe the shared database, so every node reports
// the same values; aggregate them with max, not sum.
//
// A nil *Metrics is valid and records nothing, so code and tests that build
// an intake or drainer without metrics need no stand-in.
package metrics

import (
	"log/slog"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Delivery outcome labels of mefor_deliveries_total. A delivery attempt has
// exactly one.
const (
	OutcomeOK       = "ok"
	OutcomeAE       = "AE"
	OutcomeAR       = "AR"
	OutcomeTimeout  = "timeout"
	OutcomeRefused  = "refused"
	OutcomeClosed   = "closed"
	OutcomeTLS      = "tls"
	OutcomeIOError  = "io-error"
	namespace       = "mefor"
	defaultCacheTTL = 5 * time.Second
)

// Outcomes lists every outcome label, in documentation order.
func Outcomes() []string {
	return []string{OutcomeOK, OutcomeAE, OutcomeAR, OutcomeTimeout, OutcomeRefused, OutcomeClosed, OutcomeTLS, OutcomeIOError}
}

// Rejection reasons of mefor_messages_rejected_total.
const (
	// RejectUnparseable: the message did not parse; it was stored with
	// status error and answered AR.
	RejectUnparseable = "unparseable"
	// RejectOversize: the frame was larger than the listener's
	// max_frame_size; answered AR and the connection closed.
	RejectOversize = "oversize"
	// RejectNotStored: the database could not store the message; no ACK,
	// the connection closed so the sender sends it again.
	RejectNotStored = "not-stored"
	// RejectLockTimeout: storing the message waited for a lock longer
	// than intake's lock_timeout (a lane held by another session); no ACK,
	// the connection closed so the sender sends it again.
	RejectLockTimeout = "lock-timeout"
	// RejectNotLeaseHolder: the node no longer held the listener lease;
	// no ACK, the connection closed.
	RejectNotLeaseHolder = "not-lease-holder"
)

// Reasons of mefor_connections_closed_total.
const (
	// CloseUnparseableInARow: the listener's max_unparseable_in_a_row
	// frames in a row on the connection did not parse; the last was
	// answered AR, then the connection was closed.
	CloseUnparseableInARow = "unparseable-in-a-row"
)

// intakeBuckets resolve the parts of an ACK well below a millisecond,
// where a durable commit on a local disk lies.
var intakeBuckets = []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5}

// Options configure New.
type Options struct {
	// Cluster, when set, reads the cluster gauges at scrape time.
	Cluster *ClusterCollector
	// Node, when set, reports this node's gauges.
	Node *NodeGauges
	// Logger receives collection failures. Nil discards them.
	Logger *slog.Logger
}

// Metrics is one node's metrics. Its methods are safe for concurrent use
// and do nothing on a nil receiver.
type Metrics struct {
	registry *prometheus.Registry

	received         *prometheus.CounterVec
	rejected         *prometheus.CounterVec
	connsClosed      *prometheus.CounterVec
	paced            *prometheus.CounterVec
	connsRefused     *prometheus.CounterVec
	deliveries       *prometheus.CounterVec
	deadLetters      *prometheus.CounterVec
	tampered         *prometheus.CounterVec
	deliveryDuration *prometheus.HistogramVec
	ackDuration      *prometheus.HistogramVec
	refSyncFailures  *prometheus.CounterVec
	maintenanceRuns  *prometheus.CounterVec
	gathers          *prometheus.CounterVec
	sharedHandoffs   *prometheus.CounterVec
	failedTurns      prometheus.Counter
	sharedReads      *prometheus.CounterVec
	intakeWait       prometheus.Histogram
	intakeCommit     prometheus.Histogram
	intakeBatch      prometheus.Histogram
	egressRefused    *prometheus.CounterVec
}

// New builds a node's metrics on a registry of its own, with the Go runtime
// and process collectors.
func New(opts Options) *Metrics {
	m := &Metrics{
		registry: prometheus.NewRegistry(),
		received: counterVec("messages_received_total",
			"Messages stored by this node's intake, by channel (unparseable ones included).",
			"channel"),
		rejected: counterVec("messages_rejected_total",
			"Messages answered AR or left without an ACK, by channel and reason (unparseable, oversize, not-stored, lock-timeout, not-lease-holder).",
			"channel", "reason"),
		connsClosed: counterVec("connections_closed_total",
			"Connections this node's listeners closed because of what the sender sent, by channel and reason (unparseable-in-a-row).",
			"channel", "reason"),
		paced: counterVec("intake_paced_seconds_total",
			"Time connections of this node's listeners waited before a frame was read, to keep to the listener's max_messages_per_second, by channel.",
			"channel"),
		connsRefused: counterVec("connections_refused_total",
			"Connections this node's listeners closed unread, by channel and reason (not_allowed: source not in allow; max_connections, max_connections_per_ip: over a cap; tls_name: certificate name not in allow_names; tls_revoked: certificate in crl_file; tls_handshake: any other failed TLS handshake).",
			"channel", "reason"),
		deliveries: counterVec("deliveries_total",
			"Delivery attempts made by this node, by destination and outcome (ok, AE, AR, timeout, refused, closed, tls, io-error).",
			"destination", "outcome"),
		tampered: counterVec("tampered_total",
			"Rows dead-lettered because a stored value did not open as sealed for its row: altered, copied from another row, or plaintext in a sealed store (never sent).", "stage"),
		deadLetters: counterVec("dead_letters_total",
			"Deliveries this node dead-lettered (attempts used up, or the destination left the config), by destination.",
			"destination"),
		deliveryDuration: histogramVec("delivery_duration_seconds",
			"Time from sending a message to reading the partner's answer, for attempts the partner answered, by destination.",
			[]float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30}, "destination"),
		ackDuration: histogramVec("ack_duration_seconds",
			"Time from a frame fully received to its ACK written (the message stored in between), by channel.",
			[]float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5}, "channel"),
		refSyncFailures: counterVec("reference_sync_failures_total",
			"Reference set syncs that failed on this node (the last snapshot stayed live), by set.",
			"set"),
		maintenanceRuns: counterVec("maintenance_runs_total",
			"Maintenance job runs worked by this node, by job and outcome (ok, failed).",
			"job", "outcome"),
		gathers: counterVec("drainer_gathers_total",
			"Times a woken drainer of this node waited before reading its lane so that rows committed meanwhile share one hand-off (a dense lane while the host's CPUs are short), by stage (ingress, routed, outbound).",
			"stage"),
		sharedHandoffs: counterVec("handoffs_shared_total",
			"Route and transform hand-offs and delivery record windows of this node committed in a transaction shared with other lanes', by stage (ingress: routing, routed: transforming, outbound: recording deliveries).",
			"stage"),
		failedTurns: prometheus.NewCounter(counterOpts("handoff_turns_failed_total",
			"Transactions of this node's hand-off turns (one drainer's hand-off or record, or several sharing) that did not commit (a lock held elsewhere past 100ms, an execution superseded, an error); each of their hand-offs and records was then committed alone.")),
		sharedReads: counterVec("lane_reads_shared_total",
			"Lane reads of this node's drainers answered by a round trip shared with other lanes' reads (made while another read was in flight), by stage (ingress, routed, outbound).",
			"stage"),
		intakeWait: prometheus.NewHistogram(histogramOpts("intake_commit_wait_seconds",
			"Time a parsed message waited for the intake commit that stored it to start (behind the commit in flight), per message.",
			intakeBuckets)),
		intakeCommit: prometheus.NewHistogram(histogramOpts("intake_commit_seconds",
			"Time of each intake commit, from its first statement sent to its commit confirmed durable (the messages it stores are ACKed after it).",
			intakeBuckets)),
		intakeBatch: prometheus.NewHistogram(histogramOpts("intake_commit_messages",
			"Messages stored by each intake commit (messages arriving together on any of the node's connections share one).",
			[]float64{1, 2, 4, 8, 16, 32, 64})),
		egressRefused: counterVec("egress_refused_total",
			"Connections this node refused to make because egress.allow does not allow the address they would reach (a DNS answer changed since the config was loaded), by target (destination:NAME, reference_set:NAME, alert_sink:NAME).",
			"target"),
	}
	m.registry.MustRegister(
		m.received, m.rejected, m.connsClosed, m.paced, m.connsRefused, m.deliveries, m.deadLetters, m.tampered, m.deliveryDuration, m.ackDuration,
		m.refSyncFailures, m.maintenanceRuns, m.gathers, m.sharedHandoffs, m.failedTurns,
		m.intakeWait, m.intakeCommit, m.intakeBatch, m.sharedReads, m.egressRefused,
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
	)
	if opts.Cluster != nil {
		if opts.Cluster.Logger == nil {
			opts.Cluster.Logger = opts.Logger
		}
		m.registry.MustRegister(opts.Cluster)
	}
	if opts.Node != nil {
		m.registry.MustRegister(opts.Node)
	}
	return m
}

// counterOpts names a counter of the mefor namespace.
func counterOpts(name, help string) prometheus.CounterOpts {
	return prometheus.CounterOpts{Namespace: namespace, Name: name, Help: help}
}

// counterVec is a counter of the mefor namespace with labels.
func counterVec(name, help string, labels ...string) *prometheus.CounterVec {
	return prometheus.NewCounterVec(counterOpts(name, help), labels)
}

// histogramOpts names a histogram of the mefor namespace.
func histogramOpts(name, help string, buckets []float64) prometheus.HistogramOpts {
	return prometheus.HistogramOpts{Namespace: namespace, Name: name, Help: help, Buckets: buckets}
}

// histogramVec is a histogram of the mefor namespace with labels.
func histogramVec(name, help string, buckets []float64, labels ...string) *prometheus.HistogramVec {
	return prometheus.NewHistogramVec(histogramOpts(name, help, buckets), labels)
}

// Registry is the node's registry, for tests and extra collectors.
func (m *Metrics) Registry() *prometheus.Registry { return m.registry }

// Handler serves the registry in the Prometheus text format.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.registry, promhttp.HandlerOpts{
		// A failing cluster query must not hide the counters.
		ErrorHandling: promhttp.ContinueOnError,
	})
}

// Received counts a message stored for channel.
func (m *Metrics) Received(channel string) {
	if m == nil {
		return
	}
	m.received.WithLabelValues(channel).Inc()
}

// ConnectionClosed counts a connection of channel's listener closed for
// reason, one of the Close reasons.
func (m *Metrics) ConnectionClosed(channel, reason string) {
	if m == nil {
		return
	}
	m.connsClosed.WithLabelValues(channel, reason).Inc()
}

// Paced adds a wait a connection of channel's listener took before a frame
// was read, to keep to max_messages_per_second.
func (m *Metrics) Paced(channel string, wait time.Duration) {
	if m == nil {
		return
	}
	m.paced.WithLabelValues(channel).Add(wait.Seconds())
}

// Rejected counts a message of channel answered AR or left unacknowledged,
// with one of the Reject reasons.
func (m *Metrics) Rejected(channel, reason string) {
	if m == nil {
		return
	}
	m.rejected.WithLabelValues(channel, reason).Inc()
}

// ConnectionRefused counts a connection to channel's listener closed
// unread, with one of the admission reasons.
func (m *Metrics) ConnectionRefused(channel, reason string) {
	if m == nil {
		return
	}
	m.connsRefused.WithLabelValues(channel, reason).Inc()
}

// AckWritten observes the time from a frame of channel fully received to
// its ACK written.
func (m *Metrics) AckWritten(channel string, d time.Duration) {
	if m == nil {
		return
	}
	m.ackDuration.WithLabelValues(channel).Observe(d.Seconds())
}

// IntakeWaited observes the time one message waited for its intake commit
// to start.
func (m *Metrics) IntakeWaited(d time.Duration) {
	if m == nil {
		return
	}
	m.intakeWait.Observe(d.Seconds())
}

// IntakeCommitted observes one intake commit of messages that took d.
func (m *Metrics) IntakeCommitted(messages int, d time.Duration) {
	if m == nil {
		return
	}
	m.intakeCommit.Observe(d.Seconds())
	m.intakeBatch.Observe(float64(messages))
}

// Delivered counts one delivery attempt to destination with its outcome
// label (see OutcomeOf) and, when the partner answered, the time from send
// to answer.
func (m *Metrics) Delivered(destination, outcome string, answered bool, d time.Duration) {
	if m == nil {
		return
	}
	m.deliveries.WithLabelValues(destination, outcome).Inc()
	if answered {
		m.deliveryDuration.WithLabelValues(destination).Observe(d.Seconds())
	}
}

// EgressRefused counts a connection of target that the egress policy
// refused.
func (m *Metrics) EgressRefused(target string) {
	if m == nil {
		return
	}
	m.egressRefused.WithLabelValues(target).Inc()
}

// Gathered counts a drainer of stage that waited to gather rows before it
// read its lane.
func (m *Metrics) Gathered(stage string) {
	if m == nil {
		return
	}
	m.gathers.WithLabelValues(stage).Inc()
}

// HandoffShared counts a hand-off of a drainer of stage committed in a
// transaction shared with other lanes' hand-offs.
func (m *Metrics) HandoffShared(stage string) {
	if m == nil {
		return
	}
	m.sharedHandoffs.WithLabelValues(stage).Inc()
}

// LaneReadShared counts a lane read of a drainer of stage answered by a
// round trip shared with other lanes' reads.
func (m *Metrics) LaneReadShared(stage string) {
	if m == nil {
		return
	}
	m.sharedReads.WithLabelValues(stage).Inc()
}

// HandoffTurnFailed counts a hand-off turn's transaction that did not
// commit.
func (m *Metrics) HandoffTurnFailed() {
	if m == nil {
		return
	}
	m.failedTurns.Inc()
}

// DeadLettered counts a delivery to destination given up on.
func (m *Metrics) DeadLettered(destination string) {
	if m == nil {
		return
	}
	m.deadLetters.WithLabelValues(destination).Inc()
}

// Tampered counts a row of stage dead-lettered as tampered.
func (m *Metrics) Tampered(stage string) {
	if m == nil {
		return
	}
	m.tampered.WithLabelValues(stage).Inc()
}

// ReferenceSyncFailed counts a failed sync of reference set set.
func (m *Metrics) ReferenceSyncFailed(set string) {
	if m == nil {
		return
	}
	m.refSyncFailures.WithLabelValues(set).Inc()
}

// MaintenanceRun counts one run of a maintenance job with its outcome (ok
// or failed).
func (m *Metrics) MaintenanceRun(job, outcome string) {
	if m == nil {
		return
	}
	m.maintenanceRuns.WithLabelValues(job, outcome).Inc()
}
