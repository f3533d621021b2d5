package config

import (
	"fmt"
	"math"
	"net"
	"slices"
	"strings"
	"time"

	"github.com/mefor/mefor/internal/admission"
)

// Validation checks what decoding can't: ranges, relations between fields
// and references between sections. It runs on the whole Config even when
// decoding found problems, skipping the fields that failed, so the file's
// problems are all reported in one go.

func (l *loader) validate(c *Config) {
	l.checkCluster(c.Cluster)
	l.checkChannels(c)
	l.checkHandlers(c)
	l.checkDestinations(c)
	l.checkReferenceSets(c)
	l.checkMaintenance(c.Maintenance)
	l.checkTLSExpiryWarning(c)
	l.checkAlerts(c)
	l.checkAudit(c)
	l.checkEgress(c)
	l.checkAPI(c)
	l.checkSSO(c)
	l.checkAccess(c)
}

func (l *loader) checkCluster(c Cluster) {
	p := path{section: "cluster"}
	hb, fence, lease, node := p.key("heartbeat"), p.key("fence_timeout"), p.key("lease_ttl"), p.key("node_timeout")
	ok := l.positive(p, "heartbeat", c.Heartbeat, defaultHeartbeat)
	ok = l.positive(p, "fence_timeout", c.FenceTimeout, defaultFenceTimeout) && ok
	ok = l.positive(p, "lease_ttl", c.LeaseTTL, defaultLeaseTTL) && ok
	if l.given(node) {
		// Otherwise it derives from lease_ttl, checked above.
		ok = l.positive(p, "node_timeout", c.NodeTimeout, 3*defaultLeaseTTL) && ok
	}
	if !ok || l.failed(hb) || l.failed(fence) || l.failed(lease) {
		return
	}

	// Blame a value of the first pair out of order, preferring one that is
	// written in the file: that is the one to change.
	var blame path
	switch {
	case c.Heartbeat >= c.FenceTimeout:
		blame = l.preferGiven(hb, fence)
	case c.FenceTimeout >= c.LeaseTTL:
		blame = l.preferGiven(fence, lease)
	}
	if blame != (path{}) {
		l.errorf(blame, "breaks heartbeat < fence_timeout < lease_ttl (got heartbeat %s, fence_timeout %s, lease_ttl %s): "+
			"a node must be able to miss a heartbeat without fencing itself, and must have fenced itself before its lease expires and another node takes over; "+
			"e.g. heartbeat: %s, fence_timeout: %s, lease_ttl: %s",
			l.show(hb, c.Heartbeat), l.show(fence, c.FenceTimeout), l.show(lease, c.LeaseTTL),
			fmtDuration(c.LeaseTTL/5), fmtDuration(c.LeaseTTL*3/5), fmtDuration(c.LeaseTTL))
	}
	if c.NodeTimeout <= c.LeaseTTL && !l.failed(node) {
		l.errorf(node, "(%s) must be longer than lease_ttl (%s): a node is only considered gone after its leases have expired; e.g. node_timeout: %s",
			fmtDuration(c.NodeTimeout), l.show(lease, c.LeaseTTL), fmtDuration(3*c.LeaseTTL))
	}
}

// preferGiven returns a if it is written in the file or b isn't, else b.
func (l *loader) preferGiven(a, b path) path {
	if l.given(a) || !l.given(b) {
		return a
	}
	return b
}

func (l *loader) checkChannels(c *Config) {
	p := path{section: "channels"}
	if len(c.Channels) == 0 {
		l.errorf(p, "must define at least one channel, e.g. adt: {inbound: {mllp: {listen: 127.0.0.1:2575}}, routes: [...]}; see examples/quickstart/mefor.yaml")
	}
	for i := range c.Channels {
		l.checkChannel(c, &c.Channels[i], p.entity(c.Channels[i].Name))
	}
	l.checkListenersUnique(c.Channels)
	l.checkDirectoriesUnique(c.Channels)
}

func (l *loader) checkChannel(c *Config, ch *Channel, p path) {
	ip := p.key("inbound")
	switch {
	case ch.Inbound.MLLP != nil && ch.Inbound.File != nil:
		l.errorf(ip.key("file"), "is set next to mllp:; a channel has one inbound, so give the files a channel of their own")
	case ch.Inbound.MLLP != nil:
		l.checkMLLPInbound(ch.Inbound.MLLP, ip.key("mllp"))
	case ch.Inbound.File != nil:
		l.checkFileInbound(ch.Inbound.File, ip.key("file"))
	case l.given(ip):
		l.errorf(ip, "needs an mllp: or a file: block, e.g. inbound: {mllp: {listen: 127.0.0.1:2575}}")
	case !repliesTo(c, ch.Name):
		l.errorf(ip, "is required: where the channel receives messages, e.g. inbound: {mllp: {listen: 127.0.0.1:2575}} "+
			"(a channel that only takes a destination's replies, named in its reply_to, needs none)")
	}

	if ack := []AckAfter{AckAfterReceived}; !slices.Contains(ack, ch.AckAfter) {
		l.errorf(p.key("ack_after"), "%q is not supported; allowed values: %s", ch.AckAfter, joinStrings(ack))
	}

	rp := p.key("routes")
	if len(ch.Routes) == 0 && !l.failed(rp) {
		l.warnf(rp, "is empty: every message the channel receives will be stored as unrouted")
	}
	names := make(map[string]int)
	for i := range ch.Routes {
		r := &ch.Routes[i]
		ip := rp.index(i)
		if np := ip.key("name"); l.given(np) {
			if !namePattern.MatchString(r.Name) {
				l.errorf(np, "%s", badName(r.Name))
			} else if j, dup := names[r.Name]; dup {
				l.errorf(np, "%q is already the name of routes[%d]; route names must be unique within a channel", r.Name, j)
			}
		}
		names[r.Name] = i
		l.checkRoute(c, r, ip)
	}
}

func (l *loader) checkMLLPInbound(in *MLLPInbound, p path) {
	lp := p.key("listen")
	if !l.given(lp) {
		l.errorf(lp, "is required: the host:port to listen on (e.g. listen: 127.0.0.1:2575)")
	} else if err := checkHostPort(in.Listen, false); err != nil {
		l.errorf(lp, "%q %v", in.Listen, err)
	}
	if in.MaxFrameSize <= 0 || in.MaxFrameSize > maxFrameSize {
		l.errorf(p.key("max_frame_size"), "must be from 1 byte to 1GiB (e.g. max_frame_size: 1MiB)")
	}
	l.positive(p, "read_timeout", in.ReadTimeout, defaultReadTimeout)
	l.positive(p, "idle_timeout", in.IdleTimeout, defaultIdleTimeout)
	if kp := p.key("keep_unparseable"); !l.failed(kp) {
		switch {
		case in.KeepUnparseable <= 0:
			l.errorf(kp, "must be at least 1 byte (e.g. keep_unparseable: 64KiB): an unparseable frame is kept for inspection")
		case in.KeepUnparseable > in.MaxFrameSize && l.given(kp) && in.MaxFrameSize > 0:
			l.warnf(kp, "(%d bytes) is more than max_frame_size (%d bytes): no frame is that long, so every unparseable frame is kept whole",
				in.KeepUnparseable, in.MaxFrameSize)
		}
	}
	if mp := p.key("max_unparseable_in_a_row"); !l.failed(mp) && in.MaxUnparseableInARow <= 0 {
		l.errorf(mp, "must be at least 1 (e.g. max_unparseable_in_a_row: %d)", defaultMaxUnparseableInARow)
	}
	if rp := p.key("max_messages_per_second"); !l.failed(rp) && l.given(rp) &&
		(in.MaxMessagesPerSecond <= 0 || in.MaxMessagesPerSecond > maxMessagesPerSecond) {
		l.errorf(rp, "must be more than 0 and at most %d (e.g. max_messages_per_second: 50), or left out for no limit", maxMessagesPerSecond)
	}
	l.checkInboundTLS(in, p)
	l.checkAllow(in, p)
	if k := p.key("max_connections"); !l.failed(k) && in.MaxConnections < 1 {
		l.errorf(k, "must be at least 1: how many connections the listener holds at once (e.g. max_connections: %d, the default)", defaultMaxConnections)
	}
	if k := p.key("max_connections_per_ip"); !l.failed(k) && in.MaxConnectionsPerIP < 1 {
		l.errorf(k, "must be at least 1: how many connections the listener holds at once from one address (e.g. max_connections_per_ip: %d, the default)",
			defaultMaxConnectionsPerIP)
	}
}

// checkAllow checks a listener's allow list: addresses and CIDR networks,
// never host names.
func (l *loader) checkAllow(in *MLLPInbound, p path) {
	ap := p.key("allow")
	if !l.given(ap) || l.failed(ap) {
		return
	}
	if len(in.Allow) == 0 {
		l.errorf(ap, "is empty, so no sender could connect; list the senders' addresses or networks (e.g. allow: [10.1.2.3, 10.20.0.0/16]), "+
			"or remove allow to accept any source")
		return
	}
	for i, entry := range in.Allow {
		if _, err := admission.ParseSource(entry); err != nil {
			l.errorf(ap.index(i), "%v", err)
		}
	}
}

// checkListenersUnique reports channels that would listen on the same port.
// A wildcard host (":2575", "0.0.0.0:2575") conflicts with every host on
// that port.
func (l *loader) checkListenersUnique(channels []Channel) {
	type listener struct{ host, port, channel string }
	var seen []listener
	for _, ch := range channels {
		if ch.Inbound.MLLP == nil {
			continue
		}
		host, port, err := net.SplitHostPort(ch.Inbound.MLLP.Listen)
		if err != nil {
			continue // reported by checkMLLPInbound
		}
		p := path{section: "channels"}.entity(ch.Name).key("inbound").key("mllp").key("listen")
		for _, o := range seen {
			if o.port == port && (o.host == host || isWildcard(o.host) || isWildcard(host)) {
				l.errorf(p, "%s overlaps channel %q, which listens on %s; give each channel its own port",
					ch.Inbound.MLLP.Listen, o.channel, net.JoinHostPort(o.host, o.port))
				break
			}
		}
		seen = append(seen, listener{host: host, port: port, channel: ch.Name})
	}
}

func isWildcard(host string) bool {
	return host == "" || host == "0.0.0.0" || host == "::"
}

func (l *loader) checkRoute(c *Config, r *Route, p path) {
	if c.Handler(r.Handler) == nil {
		names := []string{string(HandlerPassthrough)}
		for _, h := range c.Handlers {
			names = append(names, h.Name)
		}
		l.errorf(p.key("handler"), "%q is not defined (declare it under handlers:, or use the built-in passthrough)%s",
			r.Handler, didYouMean(r.Handler, names, "%q"))
	}

	dp := p.key("destinations")
	var names []string
	for _, d := range c.Destinations {
		names = append(names, d.Name)
	}
	if len(r.Destinations) == 0 {
		example := "downstream"
		if len(names) > 0 {
			example = names[0]
		}
		l.errorf(dp, "must list at least one destination (e.g. destinations: [%s])", example)
	}
	for i, name := range r.Destinations {
		switch {
		case slices.Index(r.Destinations, name) < i:
			l.errorf(dp.index(i), "%q is listed twice; a route delivers a message once per destination", name)
		case c.Destination(name) == nil:
			l.errorf(dp.index(i), "%q is not defined (declare it under destinations:)%s", name, didYouMean(name, names, "%q"))
		}
	}
	l.checkMatch(&r.Match, p.key("match"))
}

func (l *loader) checkMatch(m *Match, p path) {
	check := func(key string, values []string, valid func(string) string) {
		kp := p.key(key)
		if !l.given(kp) {
			return
		}
		if len(values) == 0 {
			l.errorf(kp, "lists no values, so the route would match nothing; list at least one, or remove the key to accept any")
		}
		for i, v := range values {
			switch {
			case strings.TrimSpace(v) != v || v == "":
				l.errorf(kp.index(i), "%q is blank or has surrounding spaces; it would never match", v)
			case valid != nil:
				if msg := valid(v); msg != "" {
					l.errorf(kp.index(i), "%s", msg)
				}
			}
		}
	}
	check("message_type", m.MessageType, codeCheck("message type", "ADT"))
	check("trigger_event", m.TriggerEvent, codeCheck("trigger event", "A01"))
	check("sending_application", m.SendingApplication, nil)
	check("sending_facility", m.SendingFacility, nil)
	check("receiving_application", m.ReceivingApplication, nil)
	check("receiving_facility", m.ReceivingFacility, nil)
	check("processing_id", m.ProcessingID, func(v string) string {
		if v == "P" || v == "D" || v == "T" {
			return ""
		}
		return fmt.Sprintf("%q is not a processing ID; use P (production), D (debugging) or T (training)", v)
	})
	check("version", m.Version, nil)
}

// codeCheck checks an HL7 message type or trigger event: three upper-case
// letters or digits. Codes compare case-sensitively, so "adt" would never
// match and is refused.
func codeCheck(what, example string) func(string) string {
	isCode := func(v string) bool {
		return len(v) == 3 && strings.IndexFunc(v, func(r rune) bool {
			return (r < 'A' || r > 'Z') && (r < '0' || r > '9')
		}) < 0
	}
	return func(v string) string {
		switch {
		case isCode(v):
			return ""
		case isCode(strings.ToUpper(v)):
			return fmt.Sprintf("%q is not a %s: HL7 codes are upper case and compared exactly; did you mean %q?", v, what, strings.ToUpper(v))
		}
		return fmt.Sprintf("%q is not a %s: three upper-case letters or digits, e.g. %s", v, what, example)
	}
}

func (l *loader) checkHandlers(c *Config) {
	used := make(map[string]bool)
	for _, ch := range c.Channels {
		for _, r := range ch.Routes {
			used[r.Handler] = true
		}
	}
	kinds := handlerKinds()
	for i := range c.Handlers {
		h := &c.Handlers[i]
		p := path{section: "handlers"}.entity(h.Name)
		if h.Name == string(HandlerPassthrough) && h.Type != HandlerPassthrough && !l.failed(p.key("type")) {
			l.errorf(p, "passthrough is the name of the built-in handler that forwards messages unchanged; pick another name")
		}
		if k := slices.IndexFunc(kinds, func(k handlerKind) bool { return k.typ == h.Type }); k >= 0 && kinds[k].check != nil {
			kinds[k].check(l, h, p)
		}
		if !used[h.Name] {
			l.warnf(p, "is not used by any route")
		}
	}
}

func (l *loader) checkDestinations(c *Config) {
	used := make(map[string]bool)
	for _, ch := range c.Channels {
		for _, r := range ch.Routes {
			for _, d := range r.Destinations {
				used[d] = true
			}
		}
	}
	kinds := destinationKinds()
	for i := range c.Destinations {
		d := &c.Destinations[i]
		p := path{section: "destinations"}.entity(d.Name)
		if k := slices.IndexFunc(kinds, func(k destinationKind) bool { return k.typ == d.Type }); k >= 0 {
			kinds[k].check(l, d, p)
		}
		l.checkOrdering(d.Ordering, p.key("ordering"))
		l.checkRetry(d.Retry, p.key("retry"))
		l.checkRecordBatch(d.RecordBatch, p.key("record_batch"))
		l.checkOnReject(d.OnReject, p.key("on_reject"))
		l.checkClientErrorPolicy(d, p)
		l.checkReplyTo(c, d, p)
		if !used[d.Name] {
			l.warnf(p, "is not used by any route")
		}
	}
}

func (l *loader) checkOrdering(o Ordering, p path) {
	mp, lp, kp := p.key("mode"), p.key("lanes"), p.key("key")
	if l.failed(mp) {
		return
	}
	modes := []OrderingMode{OrderFIFO, OrderParallel, OrderPartitioned}
	switch o.Mode {
	case OrderFIFO:
		if l.given(lp) && o.Lanes != 1 {
			l.errorf(lp, "must be 1 with mode: fifo, which delivers one message at a time in order; for more lanes use mode: partitioned (ordered per key) or parallel (unordered)")
		}
	case OrderParallel, OrderPartitioned:
		switch {
		case !l.given(lp):
			l.errorf(lp, "is required with mode: %s: how many messages to deliver at once, 2 to %d (e.g. lanes: 4)", o.Mode, maxLanes)
		case o.Lanes == 1:
			l.errorf(lp, "must be at least 2 with mode: %s; for a single lane use mode: fifo", o.Mode)
		case o.Lanes < 2 || o.Lanes > maxLanes:
			l.errorf(lp, "must be from 2 to %d (e.g. lanes: 4)", maxLanes)
		}
	default:
		l.errorf(mp, "%q is not an ordering mode (one of %s)%s", o.Mode, joinStrings(modes), didYouMean(string(o.Mode), toStrings(modes), "%s"))
		return
	}

	switch {
	case o.Mode == OrderPartitioned && !l.given(kp):
		l.errorf(kp, "is required with mode: partitioned: the HL7 location whose value keeps messages in order, e.g. key: PID-3.1 to keep each patient's messages in order")
	case o.Mode == OrderPartitioned:
		if err := checkHL7Path(o.Key); err != nil {
			l.errorf(kp, "%q is not a valid HL7 location: %v", o.Key, err)
		}
	case l.given(kp):
		l.errorf(kp, "only applies to mode: partitioned; remove it, or set mode: partitioned to keep order per key")
	}
}

func (l *loader) checkOnReject(r RejectPolicy, p path) {
	if l.failed(p) {
		return
	}
	policies := []RejectPolicy{RejectDeadLetter, RejectRetry}
	if !slices.Contains(policies, r) {
		l.errorf(p, "%q is not an on_reject policy (one of %s)%s", r, joinStrings(policies), didYouMean(string(r), toStrings(policies), "%s"))
	}
}

func (l *loader) checkRetry(r Retry, p path) {
	if r.MaxAttempts < 0 {
		l.errorf(p.key("max_attempts"), "must be 0 (retry forever) or more (e.g. max_attempts: 10)")
	}
	okBackoff := l.positive(p, "backoff", r.InitialBackoff, defaultBackoff)
	if !(r.Multiplier >= 1) || math.IsInf(r.Multiplier, 0) {
		l.errorf(p.key("multiplier"), "must be a number of at least 1; 1 keeps the wait constant (e.g. multiplier: 2)")
	}
	if okBackoff && r.MaxBackoff < r.InitialBackoff && !l.failed(p.key("backoff")) {
		l.errorf(p.key("max_backoff"), "(%s) must be at least backoff (%s) (e.g. max_backoff: %s)",
			fmtDuration(r.MaxBackoff), l.show(p.key("backoff"), r.InitialBackoff), fmtDuration(defaultMaxBackoff))
	}
}

// positive reports a duration at key k of p that isn't > 0, suggesting the
// default. It returns whether d is usable.
func (l *loader) positive(p path, k string, d, def time.Duration) bool {
	if d > 0 {
		return true
	}
	l.errorf(p.key(k), "must be > 0 (e.g. %s: %s)", k, fmtDuration(def))
	return false
}

// show formats a duration for a message, marking it when it's a default the
// reader won't find in the file.
func (l *loader) show(p path, d time.Duration) string {
	if l.given(p) {
		return fmtDuration(d)
	}
	return fmtDuration(d) + " (default)"
}

// fmtDuration formats d the way people write it: 5m rather than 5m0s.
func fmtDuration(d time.Duration) string {
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}

func toStrings[T ~string](values []T) []string {
	out := make([]string, len(values))
	for i, v := range values {
		out[i] = string(v)
	}
	return out
}

func joinStrings[T ~string](values []T) string {
	return strings.Join(toStrings(values), ", ")
}
