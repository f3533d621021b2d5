package metrics

import "github.com/mefor/mefor/internal/connector"

// OutcomeOf maps a connector attempt to its mefor_deliveries_total outcome
// label. The label follows what the partner answered, not the retry
// decision: an AE is AE even where ae_is_failure: false counts it as
// delivered, so a dashboard sees application errors either way.
//
//	delivered with AA or CA   ok
//	delivered with AE or CE   AE   (ae_is_failure: false)
//	AE                        AE
//	AR                        AR
//	timeout                   timeout
//	refused                   refused
//	egress                    refused (egress.allow refused the address)
//	closed                    closed
//	tls                       tls
//	http-5xx, http-429        AE   (the partner answered with an error; retried)
//	http-4xx                  AR   (the partner refuses the request)
//	io-error                  io-error (file destinations)
//	bad-ack                   io-error (the reply was not a readable ACK)
//	anything else             io-error
func OutcomeOf(outcome, ackCode string) string {
	switch outcome {
	case connector.OutcomeDelivered:
		if ackCode == "AE" || ackCode == "CE" {
			return OutcomeAE
		}
		return OutcomeOK
	case connector.OutcomeAE:
		return OutcomeAE
	case connector.OutcomeAR:
		return OutcomeAR
	case connector.OutcomeTimeout:
		return OutcomeTimeout
	case connector.OutcomeRefused, connector.OutcomeEgress:
		return OutcomeRefused
	case connector.OutcomeClosed:
		return OutcomeClosed
	case connector.OutcomeTLS:
		return OutcomeTLS
	case connector.OutcomeHTTPServerError, connector.OutcomeHTTPThrottled:
		return OutcomeAE
	case connector.OutcomeHTTPClientError:
		return OutcomeAR
	}
	return OutcomeIOError
}

// Answered reports whether an attempt with this connector outcome got an
// answer from the partner, so its send-to-answer time is meaningful.
func Answered(outcome string) bool {
	switch outcome {
	case connector.OutcomeDelivered, connector.OutcomeAE, connector.OutcomeAR, connector.OutcomeBadAck,
		connector.OutcomeHTTPServerError, connector.OutcomeHTTPThrottled, connector.OutcomeHTTPClientError, connector.OutcomeHTTPRedirect:
		return true
	}
	return false
}
