package hl7

import (
	"crypto/rand"
	"strconv"
	"strings"
	"time"
)

// NewControlID returns a fresh message control id (MSH-10) of 20 characters,
// the most HL7 allows: 12 base-36 digits of the current time in nanoseconds,
// so ids sort roughly by creation, and 8 random base-32 characters (40
// bits), so ids generated in the same nanosecond on different nodes of a
// cluster still differ. It uses only uppercase letters and digits and so
// never needs escaping.
func NewControlID() string { return newControlID(time.Now()) }

func newControlID(now time.Time) string {
	ts := strings.ToUpper(strconv.FormatInt(now.UnixNano(), 36))
	const tsLen = 12 // enough until the year 2119
	if len(ts) < tsLen {
		ts = strings.Repeat("0", tsLen-len(ts)) + ts
	} else if len(ts) > tsLen {
		ts = ts[len(ts)-tsLen:]
	}
	return ts + rand.Text()[:8]
}
