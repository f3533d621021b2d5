package config

import (
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
)

// Decoding turns the YAML tree into a Config. It checks shape and syntax:
// unknown or repeated keys, lists where values belong, malformed durations.
// Everything that needs the whole Config, such as references between
// sections, is left to validate.

// decode fills a Config from root, which may be nil for an empty file.
// Fields the file doesn't set keep their defaults.
func (l *loader) decode(root *yaml.Node) *Config {
	c := &Config{Cluster: Cluster{
		Heartbeat:        defaultHeartbeat,
		FenceTimeout:     defaultFenceTimeout,
		LeaseTTL:         defaultLeaseTTL,
		ListenerPriority: DefaultListenerPriority,
	}, TLSExpiryWarning: defaultTLSExpiryWarning}
	var top path
	m := l.mapping(root, top, "cluster", "channels", "handlers", "destinations", "reference_sets", "maintenance", "tls_expiry_warning", "alerts", "encryption", "egress", "api", "audit", "access")
	l.decodeCluster(m["cluster"], top.key("cluster"), &c.Cluster)
	decodeScalar(l, m, top, "tls_expiry_warning", &c.TLSExpiryWarning, parseAge)
	c.Maintenance = defaultMaintenance()
	l.decodeMaintenance(m["maintenance"], top.key("maintenance"), &c.Maintenance)
	if an, ok := m["alerts"]; ok {
		c.Alerts = l.decodeAlerts(an, top.key("alerts"))
	}
	c.Audit = l.decodeAudit(m["audit"], top.key("audit"))
	if en, ok := m["encryption"]; ok {
		c.Encryption = l.decodeEncryption(en, top.key("encryption"))
	}
	if an, ok := m["api"]; ok {
		c.API = l.decodeAPI(an, top.key("api"))
	}
	c.Access = l.decodeAccess(m["access"], top.key("access"))
	if en, ok := m["egress"]; ok {
		c.Egress = l.decodeEgress(en, top.key("egress"))
	}
	l.named(m["channels"], top.key("channels"), func(name string, n *yaml.Node, p path) {
		c.Channels = append(c.Channels, l.decodeChannel(name, n, p))
	})
	l.named(m["handlers"], top.key("handlers"), func(name string, n *yaml.Node, p path) {
		c.Handlers = append(c.Handlers, l.decodeHandler(name, n, p))
	})
	l.named(m["destinations"], top.key("destinations"), func(name string, n *yaml.Node, p path) {
		c.Destinations = append(c.Destinations, l.decodeDestination(name, n, p))
	})
	l.named(m["reference_sets"], top.key("reference_sets"), func(name string, n *yaml.Node, p path) {
		c.ReferenceSets = append(c.ReferenceSets, l.decodeReferenceSet(name, n, p))
	})
	return c
}

func (l *loader) decodeCluster(n *yaml.Node, p path, c *Cluster) {
	m := l.mapping(n, p, "heartbeat", "fence_timeout", "lease_ttl", "node_timeout", "listener_priority")
	decodeScalar(l, m, p, "heartbeat", &c.Heartbeat, parseDuration)
	decodeScalar(l, m, p, "fence_timeout", &c.FenceTimeout, parseDuration)
	decodeScalar(l, m, p, "lease_ttl", &c.LeaseTTL, parseDuration)
	decodeScalar(l, m, p, "node_timeout", &c.NodeTimeout, parseDuration)
	decodeScalar(l, m, p, "listener_priority", &c.ListenerPriority, parseInt)
	if c.ListenerPriority < 0 || c.ListenerPriority > MaxListenerPriority {
		l.errorf(p.key("listener_priority"), "must be from 0 (never take the listeners) to %d, got %d", MaxListenerPriority, c.ListenerPriority)
	}
	if !l.given(p.key("node_timeout")) {
		c.NodeTimeout = 3 * c.LeaseTTL // checkCluster reports a bad lease_ttl
	}
}

func (l *loader) decodeChannel(name string, n *yaml.Node, p path) Channel {
	ch := Channel{Name: name, AckAfter: AckAfterReceived}
	m := l.mapping(n, p, "inbound", "ack_after", "routes")

	if in, ok := m["inbound"]; ok {
		ip := p.key("inbound")
		im := l.mapping(in, ip, "mllp", "file")
		if mn, ok := im["mllp"]; ok {
			ch.Inbound.MLLP = l.decodeMLLPInbound(mn, ip.key("mllp"))
		}
		if fn, ok := im["file"]; ok {
			ch.Inbound.File = l.decodeFileInbound(fn, ip.key("file"))
		}
	}
	decodeScalar(l, m, p, "ack_after", &ch.AckAfter, asString)
	for i, rn := range l.sequence(m["routes"], p.key("routes")) {
		ch.Routes = append(ch.Routes, l.decodeRoute(name, i, rn, p.key("routes").index(i)))
	}
	return ch
}

func (l *loader) decodeMLLPInbound(n *yaml.Node, p path) *MLLPInbound {
	in := &MLLPInbound{
		MaxFrameSize: defaultMaxFrameSize,
		ReadTimeout:  defaultReadTimeout,
		IdleTimeout:  defaultIdleTimeout,

		KeepUnparseable:      defaultKeepUnparseable,
		MaxUnparseableInARow: defaultMaxUnparseableInARow,
		MaxConnections:       defaultMaxConnections,
		MaxConnectionsPerIP:  defaultMaxConnectionsPerIP,
	}
	m := l.mapping(n, p, "listen", "max_frame_size", "read_timeout", "idle_timeout", "tls", "plaintext",
		"keep_unparseable", "max_unparseable_in_a_row", "max_messages_per_second",
		"allow", "max_connections", "max_connections_per_ip")
	decodeScalar(l, m, p, "listen", &in.Listen, asString)
	decodeScalar(l, m, p, "max_frame_size", &in.MaxFrameSize, parseSize)
	decodeScalar(l, m, p, "read_timeout", &in.ReadTimeout, parseDuration)
	decodeScalar(l, m, p, "idle_timeout", &in.IdleTimeout, parseDuration)
	decodeScalar(l, m, p, "plaintext", &in.Plaintext, parseBool)
	decodeScalar(l, m, p, "keep_unparseable", &in.KeepUnparseable, parseSize)
	decodeScalar(l, m, p, "max_unparseable_in_a_row", &in.MaxUnparseableInARow, parseInt)
	decodeScalar(l, m, p, "max_messages_per_second", &in.MaxMessagesPerSecond, parseFloat)
	l.strings(m, p, "allow", &in.Allow)
	decodeScalar(l, m, p, "max_connections", &in.MaxConnections, parseInt)
	decodeScalar(l, m, p, "max_connections_per_ip", &in.MaxConnectionsPerIP, parseInt)
	if tn, ok := m["tls"]; ok {
		in.TLS = l.decodeServerTLS(tn, p.key("tls"))
	}
	return in
}

func (l *loader) decodeRoute(channel string, i int, n *yaml.Node, p path) Route {
	r := Route{
		Name:    fmt.Sprintf("%s#%d", channel, i),
		Handler: string(HandlerPassthrough),
	}
	m := l.mapping(n, p, "name", "match", "handler", "destinations")
	decodeScalar(l, m, p, "name", &r.Name, asString)
	decodeScalar(l, m, p, "handler", &r.Handler, asString)
	l.strings(m, p, "destinations", &r.Destinations)

	mp := p.key("match")
	mm := l.mapping(m["match"], mp,
		"message_type", "trigger_event",
		"sending_application", "sending_facility",
		"receiving_application", "receiving_facility",
		"processing_id", "version")
	l.strings(mm, mp, "message_type", &r.Match.MessageType)
	l.strings(mm, mp, "trigger_event", &r.Match.TriggerEvent)
	l.strings(mm, mp, "sending_application", &r.Match.SendingApplication)
	l.strings(mm, mp, "sending_facility", &r.Match.SendingFacility)
	l.strings(mm, mp, "receiving_application", &r.Match.ReceivingApplication)
	l.strings(mm, mp, "receiving_facility", &r.Match.ReceivingFacility)
	l.strings(mm, mp, "processing_id", &r.Match.ProcessingID)
	l.strings(mm, mp, "version", &r.Match.Version)
	return r
}

func (l *loader) decodeHandler(name string, n *yaml.Node, p path) Handler {
	h := Handler{Name: name}
	kinds := handlerKinds()
	keys := []string{"type"}
	for _, k := range kinds {
		if k.decode != nil {
			keys = append(keys, string(k.typ))
		}
	}
	m := l.mapping(n, p, keys...)
	decodeScalar(l, m, p, "type", &h.Type, asString)

	types := make([]string, len(kinds))
	for i, k := range kinds {
		types[i] = string(k.typ)
	}
	if !l.checkType(m, p, string(h.Type), types, "handler", "map") {
		return h
	}
	kind := kinds[slices.IndexFunc(kinds, func(k handlerKind) bool { return k.typ == h.Type })]
	l.checkOptionBlocks(m, p, string(h.Type), types, kind.decode != nil, kind.example)
	if opts, ok := m[string(kind.typ)]; ok && kind.decode != nil {
		kind.decode(l, opts, p.key(string(kind.typ)), &h)
	}
	return h
}

func (l *loader) decodeDestination(name string, n *yaml.Node, p path) Destination {
	d := Destination{
		Name:     name,
		Ordering: Ordering{Mode: OrderFIFO, Lanes: 1},
		Retry: Retry{
			MaxAttempts:    defaultMaxAttempts,
			InitialBackoff: defaultBackoff,
			Multiplier:     defaultMultiplier,
			MaxBackoff:     defaultMaxBackoff,
		},
		OnReject:        RejectDeadLetter,
		OnClientError:   ClientErrorDeadLetter,
		ReplyDepthLimit: defaultReplyDepthLimit,
		RecordBatch:     RecordBatch{Rows: defaultRecordRows, Window: defaultRecordWindow},
	}
	kinds := destinationKinds()
	keys := []string{"type", "ordering", "retry", "on_reject", "on_client_error", "reply_to", "reply_depth_limit", "record_batch"}
	types := make([]string, len(kinds))
	for i, k := range kinds {
		types[i] = string(k.typ)
	}
	keys = append(keys, types...)
	m := l.mapping(n, p, keys...)
	decodeScalar(l, m, p, "type", &d.Type, asString)

	op := p.key("ordering")
	om := l.mapping(m["ordering"], op, "mode", "lanes", "key")
	decodeScalar(l, om, op, "mode", &d.Ordering.Mode, asString)
	decodeScalar(l, om, op, "lanes", &d.Ordering.Lanes, parseInt)
	decodeScalar(l, om, op, "key", &d.Ordering.Key, asString)

	rp := p.key("retry")
	rm := l.mapping(m["retry"], rp, "max_attempts", "backoff", "multiplier", "max_backoff")
	decodeScalar(l, rm, rp, "max_attempts", &d.Retry.MaxAttempts, parseInt)
	decodeScalar(l, rm, rp, "backoff", &d.Retry.InitialBackoff, parseDuration)
	decodeScalar(l, rm, rp, "multiplier", &d.Retry.Multiplier, parseFloat)
	decodeScalar(l, rm, rp, "max_backoff", &d.Retry.MaxBackoff, parseDuration)
	decodeScalar(l, m, p, "on_reject", &d.OnReject, asString)
	decodeScalar(l, m, p, "on_client_error", &d.OnClientError, asString)
	decodeScalar(l, m, p, "reply_to", &d.ReplyTo, asString)
	decodeScalar(l, m, p, "reply_depth_limit", &d.ReplyDepthLimit, parseInt)
	bp := p.key("record_batch")
	bm := l.mapping(m["record_batch"], bp, "rows", "window")
	decodeScalar(l, bm, bp, "rows", &d.RecordBatch.Rows, parseInt)
	decodeScalar(l, bm, bp, "window", &d.RecordBatch.Window, parseDuration)

	if !l.checkType(m, p, string(d.Type), types, "destination", "mllp") {
		return d
	}
	kind := kinds[slices.IndexFunc(kinds, func(k destinationKind) bool { return k.typ == d.Type })]
	l.checkOptionBlocks(m, p, string(d.Type), types, true, kind.example)
	if opts, ok := m[string(kind.typ)]; ok {
		kind.decode(l, opts, p.key(string(kind.typ)), &d)
	}
	return d
}

// checkType reports a missing or unknown type key of a handler or
// destination. It returns false if the type is unusable.
func (l *loader) checkType(m map[string]*yaml.Node, p path, typ string, types []string, what, example string) bool {
	tp := p.key("type")
	switch {
	case l.failed(tp):
		return false
	case !l.given(tp):
		l.errorf(tp, "is required: say what kind of %s this is, one of %s (e.g. type: %s)", what, strings.Join(types, ", "), example)
		return false
	case !slices.Contains(types, typ):
		l.errorf(tp, "%q is not a %s type%s (one of %s)", typ, what, didYouMean(typ, types, "%s"), strings.Join(types, ", "))
		return false
	}
	return true
}

// checkOptionBlocks checks that the options block named like typ is present
// when the kind needs one, and that no other kind's block is.
func (l *loader) checkOptionBlocks(m map[string]*yaml.Node, p path, typ string, types []string, needsBlock bool, example string) {
	for _, other := range types {
		if _, ok := m[other]; ok && other != typ {
			l.errorf(p.key(other), "only applies to type: %s, but this is type: %s; remove it or change the type", other, typ)
		}
	}
	if _, ok := m[typ]; needsBlock && !ok {
		l.errorf(p.key("type"), "%s needs a %s: block with its settings, e.g. %s", typ, typ, example)
	}
}

// namePattern is what channel, handler, destination and route names must
// look like: they become queue lane names.
var namePattern = regexp.MustCompile(`^[a-z0-9][a-z0-9_.-]*$`)

// named decodes a mapping from names to definitions, calling each in file
// order so Config keeps the order of declaration.
func (l *loader) named(n *yaml.Node, p path, each func(name string, n *yaml.Node, p path)) {
	n = resolve(n)
	if isNull(n) {
		return
	}
	if n.Kind != yaml.MappingNode {
		l.errorAt(n, p, "must map names to definitions, not %s", describe(n))
		l.bad[p] = true
		return
	}
	l.eachName(n, p, p.entity, "names", each)
}

// eachName calls each for the entries of mapping n in file order, under
// the path child makes of their name, after refusing a name defined twice
// (the noun says what must be unique) or one that could not be a lane
// name. A name merged in by a YAML merge key may repeat silently.
func (l *loader) eachName(n *yaml.Node, p path, child func(string) path, noun string, each func(name string, n *yaml.Node, p path)) {
	seen := make(map[string]int)
	for _, e := range l.entries(n, p) {
		name := e.key.Value
		ep := child(name)
		if first, dup := seen[name]; dup {
			if !e.merged {
				l.errorAt(e.key, ep, "is defined twice (first on line %d); %s must be unique", first, noun)
			}
			continue
		}
		seen[name] = e.key.Line
		l.record(ep, e.key)
		if !namePattern.MatchString(name) {
			l.errorAt(e.key, ep, "%s", badName(name))
		}
		each(name, resolve(e.value), ep)
	}
}

// badName explains why name is refused and proposes one that isn't.
func badName(name string) string {
	msg := fmt.Sprintf("name %q must match %s: lower-case letters, digits, '_', '.' and '-', starting with a letter or digit, because names become queue lane names", name, namePattern)
	var b strings.Builder
	for _, r := range strings.ToLower(name) {
		switch {
		case 'a' <= r && r <= 'z', '0' <= r && r <= '9', r == '_', r == '.', r == '-':
			b.WriteRune(r)
		case b.Len() > 0:
			b.WriteRune('-')
		}
	}
	if fix := strings.Trim(b.String(), "_.-"); namePattern.MatchString(fix) {
		msg += fmt.Sprintf("; e.g. %q", fix)
	}
	return msg
}

type entry struct {
	key, value *yaml.Node
	merged     bool // comes from a << merge key
}

// entries lists the key/value pairs of mapping n: its own first, then those
// brought in by merge keys, so that its own keys take precedence.
func (l *loader) entries(n *yaml.Node, p path) []entry {
	var own, merged []entry
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		if k.Kind == yaml.ScalarNode && k.ShortTag() == "!!merge" {
			merged = append(merged, l.mergeEntries(v, p)...)
			continue
		}
		own = append(own, entry{key: k, value: v})
	}
	return append(own, merged...)
}

func (l *loader) mergeEntries(v *yaml.Node, p path) []entry {
	v = resolve(v)
	sources := []*yaml.Node{v}
	if v.Kind == yaml.SequenceNode {
		sources = sources[:0]
		for _, s := range v.Content {
			sources = append(sources, resolve(s))
		}
	}
	var out []entry
	for _, s := range sources {
		if s.Kind != yaml.MappingNode {
			l.errorAt(s, p, "has a << merge key that doesn't refer to a mapping; use <<: *anchor with an anchor on a mapping")
			continue
		}
		for _, e := range l.entries(s, p) {
			e.merged = true
			out = append(out, e)
		}
	}
	return out
}

// mapping checks that n is a mapping whose keys are all in known, records
// where each key is written, and returns the values by key. An absent or
// empty node is an empty mapping, so a block whose settings are all
// commented out means "all defaults".
func (l *loader) mapping(n *yaml.Node, p path, known ...string) map[string]*yaml.Node {
	m := make(map[string]*yaml.Node)
	n = resolve(n)
	if isNull(n) {
		return m
	}
	if n.Kind != yaml.MappingNode {
		if p == (path{}) {
			l.errorAt(n, p, "the file must be a block of settings such as cluster: and channels:, not %s", describe(n))
		} else {
			l.errorAt(n, p, "must be a block of settings (key: value), not %s", describe(n))
		}
		l.bad[p] = true
		return m
	}
	seen := make(map[string]int)
	for _, e := range l.entries(n, p) {
		k := e.key.Value
		kp := p.key(k)
		if e.key.Kind != yaml.ScalarNode {
			l.errorAt(e.key, p, "has a key that is %s; keys are plain words", describe(e.key))
			continue
		}
		if first, dup := seen[k]; dup {
			if !e.merged {
				l.errorAt(e.key, kp, "is set twice (first on line %d); remove one", first)
			}
			continue
		}
		seen[k] = e.key.Line
		if !slices.Contains(known, k) {
			if why, refused := refusedKeys[k]; refused {
				l.errorAt(e.key, kp, "%s", why)
				continue
			}
			l.errorAt(e.key, kp, "is not a known key%s (allowed here: %s)", didYouMean(k, known, "%s"), strings.Join(known, ", "))
			continue
		}
		l.record(kp, e.key)
		m[k] = resolve(e.value)
	}
	return m
}

// sequence checks that n is a list and returns its items, recording where
// each is written. An absent or empty node is an empty list.
func (l *loader) sequence(n *yaml.Node, p path) []*yaml.Node {
	n = resolve(n)
	if isNull(n) {
		return nil
	}
	if n.Kind != yaml.SequenceNode {
		l.errorAt(n, p, "must be a list, not %s", describe(n))
		l.bad[p] = true
		return nil
	}
	items := make([]*yaml.Node, len(n.Content))
	for i, item := range n.Content {
		items[i] = resolve(item)
		l.record(p.index(i), items[i])
	}
	return items
}

// text returns the value of scalar n with environment references expanded.
// ok is false, and an error recorded, if n isn't a usable single value.
func (l *loader) text(n *yaml.Node, p path) (s string, ok bool) {
	switch {
	case n.Kind != yaml.ScalarNode:
		l.errorAt(n, p, "must be a single value, not %s", describe(n))
	case isNull(n):
		l.errorAt(n, p, "has no value")
	default:
		s, err := expand(n.Value, l.getenv)
		if err == nil {
			return s, true
		}
		l.errorAt(n, p, "%v", err)
	}
	l.bad[p] = true
	return "", false
}

// decodeScalar sets *dst to the parsed value of key k of m, if given. A
// value that doesn't parse is reported and leaves *dst at its default.
func decodeScalar[T any](l *loader, m map[string]*yaml.Node, p path, k string, dst *T, parse func(string) (T, error)) {
	n, ok := m[k]
	if !ok {
		return
	}
	kp := p.key(k)
	s, ok := l.text(n, kp)
	if !ok {
		return
	}
	v, err := parse(s)
	if err != nil {
		l.errorAt(n, kp, "%v", err)
		l.bad[kp] = true
		return
	}
	*dst = v
}

// strings sets *dst to the list at key k of m, if given. A single value is
// accepted as a list of one, so "message_type: ADT" works like
// "message_type: [ADT]".
func (l *loader) strings(m map[string]*yaml.Node, p path, k string, dst *[]string) {
	n, ok := m[k]
	if !ok {
		return
	}
	kp := p.key(k)
	if n.Kind == yaml.ScalarNode && !isNull(n) {
		if s, ok := l.text(n, kp); ok {
			*dst = []string{s}
		}
		return
	}
	items := l.sequence(n, kp)
	values := make([]string, 0, len(items))
	for i, item := range items {
		s, ok := l.text(item, kp.index(i))
		if !ok {
			// The list as a whole is unusable: checking what's left
			// of it would only produce misleading follow-on errors.
			l.bad[kp] = true
			continue
		}
		values = append(values, s)
	}
	*dst = values
}

func asString[T ~string](s string) (T, error) {
	return T(s), nil
}

func parseInt(s string) (int, error) {
	n, err := strconv.Atoi(s)
	if err != nil {
		return 0, fmt.Errorf("%q is not a whole number", s)
	}
	return n, nil
}

func parseFloat(s string) (float64, error) {
	f, err := strconv.ParseFloat(s, 64)
	if err != nil {
		return 0, fmt.Errorf("%q is not a number", s)
	}
	return f, nil
}

func parseBool(s string) (bool, error) {
	// YAML 1.2 spells booleans true and false, in any case. The YAML 1.1
	// yes/no/on/off are refused rather than guessed at.
	switch {
	case strings.EqualFold(s, "true"):
		return true, nil
	case strings.EqualFold(s, "false"):
		return false, nil
	}
	return false, fmt.Errorf("%q is not true or false", s)
}

// resolve follows aliases to the node they refer to.
func resolve(n *yaml.Node) *yaml.Node {
	for n != nil && n.Kind == yaml.AliasNode {
		n = n.Alias
	}
	return n
}

// isNull reports whether n is absent or an empty value ("key:" or "~").
func isNull(n *yaml.Node) bool {
	return n == nil || n.Kind == yaml.ScalarNode && n.ShortTag() == "!!null"
}

// describe names what n is, for "must be a list, not …" messages.
func describe(n *yaml.Node) string {
	switch {
	case n.Kind == yaml.MappingNode:
		return "a block of settings"
	case n.Kind == yaml.SequenceNode:
		return "a list"
	case isNull(n):
		return "empty"
	default:
		return fmt.Sprintf("the value %q", n.Value)
	}
}
