package s3

import "math"

// Internals the external tests check.
const (
	ParallelMin = parallelMin
	SegmentSize = segmentSize
	MaxSegments = maxSegments
)

// ForceParallel makes every read of a large blob from its start go
// parallel (on) or stay one stream (off), whatever its probe measures,
// until restore is called. Call restore only once the readers are closed.
func ForceParallel(on bool) (restore func()) {
	old := fastStream
	fastStream = 0
	if on {
		fastStream = math.Inf(1)
	}
	return func() { fastStream = old }
}

// SegmentsInUse is how many segment buffers readers hold now.
func SegmentsInUse() int { return len(segmentSlots) }
