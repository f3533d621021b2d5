package workers

import (
	"fmt"
	"time"

	"github.com/mefor/mefor/internal/config"
	"github.com/mefor/mefor/internal/connector"
	"github.com/mefor/mefor/internal/hl7"
	"github.com/mefor/mefor/internal/pipeline"
	"github.com/mefor/mefor/jobs"
)

// verdict is what one attempt's result does to its row.
type verdict struct {
	// dead ends the row; reason says why when it is not the retry
	// policy's max_attempts.
	dead   bool
	reason string
	// backoff is the wait before the next attempt of a row that stays.
	backoff time.Duration
}

// judge applies the destination's policies to a failed or successful
// attempt, the attempts-th of its row.
func judge(dest *config.Destination, res connector.Result, attempts int) verdict {
	v := verdict{dead: !res.OK && dest.Retry.Exhausted(attempts), backoff: dest.Retry.Backoff(attempts)}
	switch {
	case res.Outcome == connector.OutcomeAR && dest.OnReject == config.RejectDeadLetter:
		// The partner will never accept it: retrying would only hold the
		// lane behind it.
		v.dead = true
		v.reason = fmt.Sprintf("partner rejected it (%s); on_reject: %s", res.AckCode, config.RejectDeadLetter)
	case res.Outcome == connector.OutcomeHTTPClientError && dest.OnClientError == config.ClientErrorDeadLetter:
		// The partner says the request itself is wrong; so does sending
		// it again.
		v.dead = true
		v.reason = fmt.Sprintf("partner refused the request (HTTP %s); on_client_error: %s", res.AckCode, config.ClientErrorDeadLetter)
	case res.Outcome == connector.OutcomeBadName:
		// The file name built from the message cannot be written, and
		// will not be on the next attempt: retrying (unlimited by
		// default) would block the lane for good. The reason is the
		// sender's description, which never holds the name.
		v.dead = true
		v.reason = "file name cannot be written: " + res.Error
	}
	if res.RetryAfter > 0 {
		// The partner said when to come back: that is the next wait,
		// within the policy's cap.
		v.backoff = min(res.RetryAfter, dest.Retry.MaxBackoff)
	}
	return v
}

// replyRoute says where a delivered attempt's reply goes: nil when the
// destination has no reply_to or the partner said nothing.
func replyRoute(dest *config.Destination, res connector.Result, ins jobs.Inserter) *pipeline.ReplyRoute {
	if dest.ReplyTo == "" || !res.OK || len(res.Reply) == 0 {
		return nil
	}
	rt := &pipeline.ReplyRoute{Channel: dest.ReplyTo, MaxDepth: dest.ReplyDepthLimit, Ins: ins}
	msg, err := hl7.Parse(res.Reply)
	if err != nil {
		rt.NotHL7 = "not an HL7 v2 message: " + err.Error()
		return rt
	}
	h := msg.Header()
	rt.ControlID, rt.MessageType, rt.TriggerEvent = h.ControlID, h.MessageType, h.TriggerEvent
	rt.SendingApp, rt.SendingFacility = h.SendingApplication, h.SendingFacility
	return rt
}
