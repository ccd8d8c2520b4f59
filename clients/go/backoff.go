package ringlock

// The reconnect schedule of a broken connection (docs/protocol.md §4): at
// once, then after doubling delays from a first delay up to a cap, each
// drawn at random in its upper half, so that many clients cut at the same
// moment do not come back at the same moment. reconnectDelay is a pure
// function of the attempt number and a random draw; the connection's reader
// counts the attempts and draws.

import (
	"math"
	"time"
)

// reconnectDelay is the pause before reconnect attempt attempt (0 for the
// first attempt after a connection broke or a connect failed), given draw
// in [0, 1).
//
// Attempt 0 goes at once. Attempt n >= 1 waits a delay drawn in [d/2, d],
// where d is first doubled n-1 times and capped at max: with the defaults
// (50ms, 3s), 25-50ms, 50-100ms, 100-200ms, ... and 1.5-3s from the eighth
// attempt on. No delay exceeds max.
func reconnectDelay(attempt int, first, max time.Duration, draw float64) time.Duration {
	if attempt <= 0 {
		return 0
	}
	ceiling := first
	// Doubling stops at the cap, so it cannot overflow.
	for doublings := attempt - 1; doublings > 0 && ceiling < max; doublings-- {
		ceiling *= 2
	}
	if ceiling > max {
		ceiling = max
	}
	if math.IsNaN(draw) || draw < 0 {
		draw = 0
	} else if draw > 1 {
		draw = 1
	}
	half := ceiling / 2
	return half + time.Duration(float64(ceiling-half)*draw)
}
