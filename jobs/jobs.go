// Package jobs holds mefor's River job kinds: one drainer kind per pipeline
// stage, keyed by lane, and the periodic maintenance kinds. It also holds the
// one entry point every producer uses to put work into a lane (Lock + Activate
// inside the producer's transaction).
package jobs

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertype"
)

// Stage names, as stored in mefor_work.stage and used as lane prefixes.
const (
	StageIngress  = "ingress"
	StageRouted   = "routed"
	StageOutbound = "outbound"
)

// River queues. Each stage has its own so a slow partner (outbound drainers
// waiting on ACKs) never starves intake routing of worker slots.
const (
	QueueIngress     = "mefor_ingress"
	QueueRouted      = "mefor_routed"
	QueueOutbound    = "mefor_outbound"
	QueueMaintenance = "mefor_maintenance"
)

// liveStates are the job states in which a drainer counts as live for its
// lane. River refuses a second job with the same unique key while one is in
// any of them, which is what makes "one drainer per lane" hold cluster-wide.
// retryable is included so a drainer that errored keeps its lane reserved
// until River retries it.
var liveStates = []rivertype.JobState{
	rivertype.JobStateAvailable,
	rivertype.JobStatePending,
	rivertype.JobStateRunning,
	rivertype.JobStateRetryable,
	rivertype.JobStateScheduled,
}

// laneUnique is the unique rule of every drainer kind: by args (only the
// lane field is tagged unique) and by the live states.
var laneUnique = river.UniqueOpts{ByArgs: true, ByState: liveStates}

// drainerMaxAttempts bounds River's own retries of a drainer that errored or
// panicked. Delivery failures never reach River (drainers snooze instead), so
// this only counts real crashes; a discarded drainer's lane is re-activated by
// reclaim.
const drainerMaxAttempts = 25

// IngressArgs drains one channel's ingress lane: parse and route.
type IngressArgs struct {
	Lane string `json:"lane" river:"unique"`
}

func (IngressArgs) Kind() string { return "mefor_ingress" }

func (IngressArgs) InsertOpts() river.InsertOpts {
	return river.InsertOpts{Queue: QueueIngress, UniqueOpts: laneUnique, MaxAttempts: drainerMaxAttempts}
}

// RoutedArgs drains one channel's routed lane: run handlers.
type RoutedArgs struct {
	Lane string `json:"lane" river:"unique"`
}

func (RoutedArgs) Kind() string { return "mefor_routed" }

func (RoutedArgs) InsertOpts() river.InsertOpts {
	return river.InsertOpts{Queue: QueueRouted, UniqueOpts: laneUnique, MaxAttempts: drainerMaxAttempts}
}

// OutboundArgs drains one destination lane: deliver, retry, dead-letter.
type OutboundArgs struct {
	Lane string `json:"lane" river:"unique"`
}

func (OutboundArgs) Kind() string { return "mefor_outbound" }

func (OutboundArgs) InsertOpts() river.InsertOpts {
	return river.InsertOpts{Queue: QueueOutbound, UniqueOpts: laneUnique, MaxAttempts: drainerMaxAttempts}
}

// ReclaimArgs is the leader's periodic sweep for lanes with backlog and no
// live drainer.
type ReclaimArgs struct{}

func (ReclaimArgs) Kind() string { return "mefor_reclaim" }

func (ReclaimArgs) InsertOpts() river.InsertOpts {
	// One pending sweep at a time: a slow sweep must not pile up behind itself.
	return river.InsertOpts{
		Queue:       QueueMaintenance,
		MaxAttempts: 3,
		UniqueOpts:  river.UniqueOpts{ByState: liveStates, ByPeriod: time.Second},
	}
}

// DrainerKinds are the job kinds that drain lanes.
func DrainerKinds() []string {
	return []string{IngressArgs{}.Kind(), RoutedArgs{}.Kind(), OutboundArgs{}.Kind()}
}

// IngressLane is the ingress lane of a channel.
func IngressLane(channel string) string { return StageIngress + ":" + channel }

// RoutedLane is the routed lane of a channel.
func RoutedLane(channel string) string { return StageRouted + ":" + channel }

// OutboundLane is a lane of a destination: partition of lanes under the
// destination's layout generation (the number its current ordering got when
// first used; see LaneGroup). partition is ignored when the destination has
// a single lane. Generation 0 lanes are named outbound:<destination> and
// outbound:<destination>#<partition>; later generations put ~<generation>
// after the destination name, which cannot contain '~' or '#'.
func OutboundLane(destination string, generation, lanes, partition int) string {
	base := StageOutbound + ":" + destination
	if generation > 0 {
		base += "~" + strconv.Itoa(generation)
	}
	if lanes <= 1 {
		return base
	}
	return base + "#" + strconv.Itoa(partition)
}

// LaneGroup is the set of lanes a lane was laid out with: the lanes of one
// destination under one ordering (mode, lane count, key) share it. Rows in
// different groups of one destination were queued under different
// orderings, so their lanes are not independent: the older group drains
// first.
func LaneGroup(lane string) string {
	group, _, _ := strings.Cut(lane, "#")
	return group
}

// StageOf returns the stage a lane belongs to.
func StageOf(lane string) (string, error) {
	stage, _, ok := strings.Cut(lane, ":")
	if !ok {
		return "", fmt.Errorf("lane %q has no stage prefix", lane)
	}
	switch stage {
	case StageIngress, StageRouted, StageOutbound:
		return stage, nil
	}
	return "", fmt.Errorf("lane %q: unknown stage %q", lane, stage)
}

// ArgsFor returns the drainer job args for a lane.
func ArgsFor(lane string) (river.JobArgs, error) {
	stage, err := StageOf(lane)
	if err != nil {
		return nil, err
	}
	switch stage {
	case StageIngress:
		return IngressArgs{Lane: lane}, nil
	case StageRouted:
		return RoutedArgs{Lane: lane}, nil
	default:
		return OutboundArgs{Lane: lane}, nil
	}
}
