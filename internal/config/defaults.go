package config

import "time"

// Defaults for settings the file leaves out.
const (
	// Cluster timings keep the ratio heartbeat:fence:lease at 1:3:5, so a
	// node survives two missed heartbeats and has stopped well before its
	// lease can pass to another node.
	defaultHeartbeat    = 1 * time.Second
	defaultFenceTimeout = 3 * time.Second
	defaultLeaseTTL     = 5 * time.Second
	// DefaultListenerPriority is cluster.listener_priority when unset.
	DefaultListenerPriority = 1
	// MaxListenerPriority bounds cluster.listener_priority.
	MaxListenerPriority = 1000

	defaultMaxFrameSize = 1 << 20
	defaultReadTimeout  = 30 * time.Second
	defaultIdleTimeout  = 5 * time.Minute

	// 64 KiB of an unparseable frame shows what a sender meant to send
	// (its header and first segments), while a sender of junk frames adds
	// at most that per frame to the database.
	defaultKeepUnparseable = 64 << 10
	// 20 unparseable frames in a row is past any sender's honest mistake
	// (a wrong encoding, a stray test message) and well short of a flood.
	defaultMaxUnparseableInARow = 20

	// A listener's connection caps: a partner needs a few connections,
	// and an interface engine in front of many senders a few dozen, while
	// thousands of idle ones would only pin memory.
	defaultMaxConnections      = 256
	defaultMaxConnectionsPerIP = 16

	defaultConnectTimeout = 5 * time.Second
	defaultAckTimeout     = 30 * time.Second

	// Retrying forever is what integration engines do by default: a
	// receiver that is down for a weekend must get its messages on Monday,
	// not have them silently dropped.
	defaultMaxAttempts = 0
	defaultBackoff     = 1 * time.Second
	defaultMultiplier  = 2
	defaultMaxBackoff  = 5 * time.Minute
)

// Limits on settings.
const (
	// maxFrameSize bounds max_frame_size: frames are held in memory, and
	// even documents embedded in OBX segments stay far below this.
	maxFrameSize = 1 << 30
	// maxMessagesPerSecond bounds max_messages_per_second: past this a
	// limit no longer slows anyone down; leave the key out instead.
	maxMessagesPerSecond = 1_000_000
	// maxLanes bounds ordering lanes: each lane is a queue with its own
	// worker and connection to the receiver.
	maxLanes = 256
)
