package metrics_test

import (
	"testing"
	"time"

	"github.com/mefor/mefor/internal/connector"
	"github.com/mefor/mefor/internal/metrics"
)

func TestOutcomeOf(t *testing.T) {
	tests := []struct{ outcome, ack, want string }{
		{connector.OutcomeDelivered, "AA", "ok"},
		{connector.OutcomeDelivered, "CA", "ok"},
		{connector.OutcomeDelivered, "", "ok"}, // a file written
		{connector.OutcomeDelivered, "AE", "AE"},
		{connector.OutcomeAE, "AE", "AE"},
		{connector.OutcomeAR, "AR", "AR"},
		{connector.OutcomeAR, "CR", "AR"},
		{connector.OutcomeTimeout, "", "timeout"},
		{connector.OutcomeRefused, "", "refused"},
		{connector.OutcomeEgress, "", "refused"},
		{connector.OutcomeClosed, "", "closed"},
		{connector.OutcomeTLS, "", "tls"},
		{connector.OutcomeIOError, "", "io-error"},
		{connector.OutcomeBadAck, "", "io-error"},
		{connector.OutcomeInternal, "", "io-error"},
		{connector.OutcomeDelivered, "200", "ok"},
		{connector.OutcomeHTTPServerError, "503", "AE"},
		{connector.OutcomeHTTPThrottled, "429", "AE"},
		{connector.OutcomeHTTPClientError, "400", "AR"},
		{connector.OutcomeHTTPRedirect, "302", "io-error"},
	}
	allowed := map[string]bool{}
	for _, o := range metrics.Outcomes() {
		allowed[o] = true
	}
	for _, tt := range tests {
		got := metrics.OutcomeOf(tt.outcome, tt.ack)
		if got != tt.want || !allowed[got] {
			t.Errorf("OutcomeOf(%q, %q) = %q, want %q", tt.outcome, tt.ack, got, tt.want)
		}
	}
	if len(allowed) != 8 {
		t.Errorf("Outcomes() = %v, want the 8 of the issue", metrics.Outcomes())
	}
}

// A nil *Metrics counts nothing and does not panic: intakes and drainers
// built without metrics (tools, tests) need no stand-in.
func TestNilMetrics(t *testing.T) {
	recordOneOfEach(nil)
}

// recordOneOfEach records one of everything a node counts through m.
func recordOneOfEach(m *metrics.Metrics) {
	m.Received("c")
	m.Rejected("c", metrics.RejectUnparseable)
	m.ConnectionClosed("c", metrics.CloseUnparseableInARow)
	m.Paced("c", time.Millisecond)
	m.ConnectionRefused("c", "not_allowed")
	m.AckWritten("c", time.Millisecond)
	m.Delivered("d", metrics.OutcomeOK, true, time.Millisecond)
	m.DeadLettered("d")
	m.ReferenceSyncFailed("s")
	m.MaintenanceRun("reclaim", "ok")
	m.EgressRefused("destination:d")
	m.Gathered("ingress")
	m.HandoffShared("routed")
	m.HandoffTurnFailed()
	m.LaneReadShared("outbound")
}
