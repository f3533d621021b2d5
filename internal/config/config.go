package config

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"slices"
	"time"
)

// Config is a loaded and validated configuration. Named things keep the order
// they were declared in, so logs and status pages list them as the file does.
//
// A Config is read-only once Load or Parse returns it, which makes it safe to
// share between goroutines.
type Config struct {
	// File is the name the configuration was loaded from, as given to Load or
	// Parse.
	File string

	Cluster      Cluster
	Channels     []Channel
	Handlers     []Handler
	Destinations []Destination
	// ReferenceSets are the code-mapping tables lookups translate through.
	ReferenceSets []ReferenceSet
	// Maintenance schedules the periodic jobs: reclaim, retention.
	Maintenance Maintenance
	// Alerts holds mefor's own alert rules and sinks; nil when the file
	// has no alerts: section.
	Alerts *Alerts
	// Audit configures the audit log beyond the database: where its trail
	// is forwarded (audit.forward).
	Audit Audit
	// TLSExpiryWarning is how long before a certificate in use expires a
	// node starts logging a warning about it, once a day. Defaults to 30
	// days.
	TLSExpiryWarning time.Duration
	// Encryption names the keys content is sealed under at rest; nil when
	// the file has no encryption: section (MEFOR_ENCRYPTION_KEYS decides).
	Encryption *Encryption
	// Egress lists where mefor may connect; nil when the file has no
	// egress: section, and mefor connects wherever the config points.
	Egress *Egress
	// API is the HTTPS operator API every node serves; nil when the file
	// has no api: section.
	API *API
	// Access is who may do what through the API: custom roles, the
	// directory groups SSO logins map to roles (access.go), and dual
	// control (access.approvals); empty without an access: section.
	Access Access

	// Warnings lists problems that don't stop mefor from running but are
	// probably mistakes, such as a destination no route sends to.
	Warnings []Error

	sum [sha256.Size]byte
	// outbound is every connection to another machine the file asks for
	// (egress.go).
	outbound []Outbound
	// pos says where each field given in the file is written, for Problem.
	pos map[path]position
}

// Hash returns the hex SHA-256 of the raw file content and of the scripts
// its javascript handlers load. Nodes compare it to detect that they were
// started with different files, and a reload with an unchanged hash changes
// nothing. It is taken before environment interpolation, so two nodes with
// the same file but different environments have the same hash.
func (c *Config) Hash() string {
	return hex.EncodeToString(c.sum[:])
}

// Channel returns the channel with the given name, or nil.
func (c *Config) Channel(name string) *Channel {
	return find(c.Channels, func(ch *Channel) bool { return ch.Name == name })
}

// Destination returns the destination with the given name, or nil.
func (c *Config) Destination(name string) *Destination {
	return find(c.Destinations, func(d *Destination) bool { return d.Name == name })
}

// Handler returns the handler with the given name, or nil. The built-in
// passthrough handler is returned for "passthrough" even though it isn't
// declared in the file.
func (c *Config) Handler(name string) *Handler {
	if h := find(c.Handlers, func(h *Handler) bool { return h.Name == name }); h != nil {
		return h
	}
	if name == string(HandlerPassthrough) {
		return &Handler{Name: name, Type: HandlerPassthrough}
	}
	return nil
}

func find[T any](items []T, match func(*T) bool) *T {
	for i := range items {
		if match(&items[i]) {
			return &items[i]
		}
	}
	return nil
}

// Cluster holds the timings that keep exactly one node in charge of each
// piece of work. Load guarantees Heartbeat < FenceTimeout < LeaseTTL <
// NodeTimeout.
type Cluster struct {
	// Heartbeat is how often a node renews its leases. Defaults to 1s.
	Heartbeat time.Duration
	// FenceTimeout is how long a node keeps working without a successful
	// renewal before it stops on its own. It is shorter than LeaseTTL so a
	// node has always stopped before another one may take its lease over.
	// Defaults to 3s.
	FenceTimeout time.Duration
	// LeaseTTL is how long a lease stays valid after its last renewal.
	// Defaults to 5s.
	LeaseTTL time.Duration
	// NodeTimeout is how long a node may stay silent before the cluster
	// considers it gone. Defaults to 3 × LeaseTTL.
	NodeTimeout time.Duration
	// ListenerPriority ranks the nodes that may take the listener lease: a
	// node takes it over only when no live node of a higher priority
	// could, and 0 means never (a DR site, a processing-only node).
	// `mefor run --listener-priority` overrides it. Defaults to 1.
	ListenerPriority int
}

// Channel receives messages on one inbound connection and routes them.
type Channel struct {
	Name     string
	Inbound  Inbound
	AckAfter AckAfter
	// Routes are evaluated in order and every matching route fires. A
	// message no route matches is stored as unrouted.
	Routes []Route
}

// Route returns the channel's route with the given name, or nil.
func (ch *Channel) Route(name string) *Route {
	return find(ch.Routes, func(r *Route) bool { return r.Name == name })
}

// Inbound says where a channel's messages come from. At most one field is
// set after loading; none only for a channel that takes the replies of a
// destination (Destination.ReplyTo) and nothing else.
type Inbound struct {
	MLLP *MLLPInbound
	File *FileInbound
}

// MLLPInbound is an MLLP listener.
type MLLPInbound struct {
	// Listen is the host:port to listen on.
	Listen string
	// MaxFrameSize is the largest message accepted, in bytes. Bigger frames
	// are rejected so one sender can't exhaust memory. Defaults to 1 MiB.
	MaxFrameSize int64
	// ReadTimeout bounds how long reading one frame may take once it has
	// started. Defaults to 30s.
	ReadTimeout time.Duration
	// IdleTimeout is how long a connection may stay silent between frames
	// before it is closed. Defaults to 5m.
	IdleTimeout time.Duration
	// TLS, when enabled, makes the listener speak MLLP over TLS only.
	TLS ServerTLS
	// KeepUnparseable is how many bytes of a frame that does not parse are
	// stored for inspection; its full length is recorded with it. A sender
	// of junk then fills the database this much per frame at most, while
	// the first bytes, which show what the sender meant to send, are kept.
	// Defaults to 64 KiB.
	KeepUnparseable int64
	// MaxUnparseableInARow closes a connection once this many frames in a
	// row on it did not parse (each is answered AR and stored first). A
	// frame that parses resets the count. Defaults to 20.
	MaxUnparseableInARow int
	// MaxMessagesPerSecond, when not zero, slows the listener's senders
	// down to this many frames per second, all its connections together:
	// the next frame is read only when the listener's token bucket allows,
	// so TCP holds the sender back and nothing already stored is refused.
	// A second's worth may come at once after a quiet spell. Defaults to
	// 0, no limit.
	MaxMessagesPerSecond float64
	// Plaintext allows a plaintext listener on an address other machines
	// can reach, which is otherwise refused.
	Plaintext bool
	// Allow lists the source addresses and networks (CIDR) that may
	// connect; a connection from any other is closed before a byte of it
	// is read. Empty means any source.
	Allow []string
	// MaxConnections caps the connections the listener holds at once.
	// Defaults to 256.
	MaxConnections int
	// MaxConnectionsPerIP caps the connections it holds at once from one
	// source address. Defaults to 16.
	MaxConnectionsPerIP int
}

// AckAfter says when a channel acknowledges a message to its sender.
type AckAfter string

// AckAfterReceived acknowledges once the message is durably stored, before
// it is routed or delivered.
const AckAfterReceived AckAfter = "received"

// Route sends the messages it matches through a handler to destinations.
type Route struct {
	// Name is unique within the channel. Unnamed routes are called
	// "<channel>#<index>", index counting from 0.
	Name  string
	Match Match
	// Handler names the handler applied before delivery. Defaults to the
	// built-in passthrough.
	Handler      string
	Destinations []string
}

// Match selects messages by MSH fields. Every non-empty list must contain the
// message's value; empty lists accept anything, so a zero Match accepts every
// message. Comparison is exact and case-sensitive, as HL7 codes are.
type Match struct {
	MessageType          []string // MSH-9.1
	TriggerEvent         []string // MSH-9.2
	SendingApplication   []string // MSH-3.1
	SendingFacility      []string // MSH-4.1
	ReceivingApplication []string // MSH-5.1
	ReceivingFacility    []string // MSH-6.1
	ProcessingID         []string // MSH-11.1
	Version              []string // MSH-12.1
}

// MessageHeader holds the MSH values a Match looks at. It lets callers match
// without this package depending on an HL7 parser.
type MessageHeader struct {
	MessageType          string
	TriggerEvent         string
	SendingApplication   string
	SendingFacility      string
	ReceivingApplication string
	ReceivingFacility    string
	ProcessingID         string
	Version              string
}

// Matches reports whether a message with header h is selected by m.
func (m *Match) Matches(h MessageHeader) bool {
	accepts := func(values []string, v string) bool {
		return len(values) == 0 || slices.Contains(values, v)
	}
	return accepts(m.MessageType, h.MessageType) &&
		accepts(m.TriggerEvent, h.TriggerEvent) &&
		accepts(m.SendingApplication, h.SendingApplication) &&
		accepts(m.SendingFacility, h.SendingFacility) &&
		accepts(m.ReceivingApplication, h.ReceivingApplication) &&
		accepts(m.ReceivingFacility, h.ReceivingFacility) &&
		accepts(m.ProcessingID, h.ProcessingID) &&
		accepts(m.Version, h.Version)
}

// HandlerType is the kind of a handler.
type HandlerType string

const (
	// HandlerPassthrough forwards messages unchanged. A handler called
	// "passthrough" of this type is always available.
	HandlerPassthrough HandlerType = "passthrough"
	// HandlerMap applies an ordered list of field edits.
	HandlerMap HandlerType = "map"
)

// Handler transforms messages on their way to destinations.
type Handler struct {
	Name string
	Type HandlerType
	// Map holds the edits of a HandlerMap, applied in order.
	Map []MapOp
	// JavaScript holds a HandlerJavaScript's settings and scripts.
	JavaScript *JavaScript
}

// MapOpKind is the kind of one map edit.
type MapOpKind string

const (
	MapSet   MapOpKind = "set"   // write Value to Target
	MapCopy  MapOpKind = "copy"  // copy From to Target
	MapClear MapOpKind = "clear" // empty Target
	// MapLookup writes to Target what From's value maps to in reference
	// set Set.
	MapLookup MapOpKind = "lookup"
)

// MapOp is one edit of a map handler. Paths are HL7 locations such as
// PID-3.1, OBX(2)-5 or PID-3[2].1, checked for syntax at load time.
type MapOp struct {
	Kind MapOpKind
	// Target is the location written: set's path, copy's to, clear's path.
	Target string
	// Value is the text set writes, and the text lookup writes on a miss
	// with OnMiss default.
	Value string
	// From is the location copy and lookup read.
	From string
	// Set, Column and OnMiss configure a lookup: the reference set, its
	// value column (empty: the set's first) and what a miss does.
	Set    string
	Column string
	OnMiss OnMiss
}

// DestinationType is the kind of a destination.
type DestinationType string

const (
	DestinationMLLP DestinationType = "mllp"
	DestinationFile DestinationType = "file"
)

// Destination is somewhere messages are delivered. Exactly one of the
// kind-specific fields is set, matching Type.
type Destination struct {
	Name string
	Type DestinationType
	MLLP *MLLPDestination
	File *FileDestination

	Ordering Ordering
	Retry    Retry
	// OnReject says what a partner's reject (AR: it will never accept the
	// message) does to a delivery. Defaults to RejectDeadLetter.
	OnReject RejectPolicy
	// HTTP, OnClientError, ReplyTo and ReplyDepthLimit: see http.go and
	// reply.go. OnClientError defaults to ClientErrorDeadLetter.
	HTTP          *HTTPDestination
	OnClientError ClientErrorPolicy
	ReplyTo       string
	// ReplyDepthLimit bounds a chain of replies: a reply that would be the
	// chain's (limit+1)th is recorded as a message with status error and
	// the reason, and not routed. Defaults to 8.
	ReplyDepthLimit int
	// RecordBatch bounds how many sends one record transaction covers and
	// how long a send waits for its record (recordbatch.go). Defaults to 32
	// rows and 5ms.
	RecordBatch RecordBatch
}

// RejectPolicy is what a partner's reject does to a delivery.
type RejectPolicy string

const (
	// RejectDeadLetter dead-letters the row at the first reject, keeping
	// the partner's reply: retrying a message the partner will never
	// accept would block its lane forever.
	RejectDeadLetter RejectPolicy = "dead-letter"
	// RejectRetry treats a reject like any failed attempt: retried under
	// the retry policy, blocking its lane meanwhile, for partners whose
	// AR means "not now".
	RejectRetry RejectPolicy = "retry"
)

// MLLPDestination delivers to an MLLP receiver and waits for its ACK.
type MLLPDestination struct {
	// Address is the receiver's host:port.
	Address string
	// ConnectTimeout bounds connecting to the receiver. Defaults to 5s.
	ConnectTimeout time.Duration
	// AckTimeout bounds sending a message and receiving its ACK. Defaults
	// to 30s.
	AckTimeout time.Duration
	// AEIsFailure makes an AE (application error) ACK count as a failed
	// delivery to retry. AR is always a failure; the destination's
	// OnReject decides whether it is retried.
	AEIsFailure bool
	// TLS, when enabled, makes every connection to the receiver TLS,
	// verified before anything is sent.
	TLS ClientTLS
	// Plaintext acknowledges that a receiver on another machine is reached
	// without TLS, which is otherwise flagged by `mefor config check` and
	// `mefor status`.
	Plaintext bool
}

// OrderingMode says how strictly a destination preserves message order.
type OrderingMode string

const (
	// OrderFIFO delivers one message at a time in arrival order; a message
	// that keeps failing holds up the ones behind it.
	OrderFIFO OrderingMode = "fifo"
	// OrderParallel delivers on several lanes with no ordering guarantee.
	OrderParallel OrderingMode = "parallel"
	// OrderPartitioned keeps order per key (say, per patient) and spreads
	// keys over lanes.
	OrderPartitioned OrderingMode = "partitioned"
)

// Ordering configures a destination's delivery lanes.
type Ordering struct {
	// Mode defaults to OrderFIFO.
	Mode OrderingMode
	// Lanes is the number of concurrent deliveries: 1 for fifo, 2–256
	// otherwise. Defaults to 1.
	Lanes int
	// Key is the HL7 path whose value picks the lane of a partitioned
	// destination; empty for other modes.
	Key string
}

// Layout names how o lays a destination's messages out over lanes: two
// orderings with the same layout put every message in the same lane.
func (o Ordering) Layout() string {
	switch o.Mode {
	case OrderParallel:
		return fmt.Sprintf("%s/%d", o.Mode, o.Lanes)
	case OrderPartitioned:
		return fmt.Sprintf("%s/%d/%s", o.Mode, o.Lanes, o.Key)
	}
	return string(OrderFIFO)
}
