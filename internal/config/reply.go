package config

// Replies routed back in: a destination's reply_to names a channel, and
// each reply the partner gives to a delivery it accepts (an MLLP ACK or
// response, an HTTP answer whose body is HL7) is stored as a new message of
// that channel, linked to the message it answers.

// defaultReplyDepthLimit stops a chain of replies (a partner answering the
// answers of a channel that sends back to it) after this many.
const defaultReplyDepthLimit = 8

// maxReplyDepthLimit keeps the limit a loop breaker rather than unlimited.
const maxReplyDepthLimit = 100

// repliesTo reports whether a destination of c sends its replies to the
// channel.
func repliesTo(c *Config, channel string) bool {
	for _, d := range c.Destinations {
		if d.ReplyTo == channel {
			return true
		}
	}
	return false
}

func (l *loader) checkReplyTo(c *Config, d *Destination, p path) {
	rp, lp := p.key("reply_to"), p.key("reply_depth_limit")
	if l.given(lp) && !l.failed(lp) && (d.ReplyDepthLimit < 1 || d.ReplyDepthLimit > maxReplyDepthLimit) {
		l.errorf(lp, "must be from 1 to %d: how many replies of replies are routed before a chain stops (e.g. reply_depth_limit: %d)",
			maxReplyDepthLimit, defaultReplyDepthLimit)
	}
	if l.failed(rp) || !l.given(rp) {
		if l.given(lp) && !l.given(rp) {
			l.errorf(lp, "only applies with reply_to: CHANNEL; remove it or set reply_to")
		}
		return
	}
	if d.Type == DestinationFile {
		l.errorf(rp, "does not apply to type: file, which gets no reply; use it on an mllp or http destination")
		return
	}
	if c.Channel(d.ReplyTo) == nil {
		var names []string
		for _, ch := range c.Channels {
			names = append(names, ch.Name)
		}
		l.errorf(rp, "%q is not a channel (declare it under channels:; it needs no inbound when it only takes replies)%s",
			d.ReplyTo, didYouMean(d.ReplyTo, names, "%q"))
	}
}
