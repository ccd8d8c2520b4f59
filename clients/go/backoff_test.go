package ringlock

import (
	"math"
	"testing"
	"time"
)

const (
	firstDelay = 50 * time.Millisecond
	maxDelay   = 3 * time.Second
)

func TestReconnectGoesAtOnceFirst(t *testing.T) {
	for _, draw := range []float64{0, 0.5, 0.99} {
		if got := reconnectDelay(0, firstDelay, maxDelay, draw); got != 0 {
			t.Errorf("attempt 0, draw %v: %v, want at once", draw, got)
		}
	}
}

func TestReconnectDelaysDoubleWithinTheirUpperHalf(t *testing.T) {
	ceiling := firstDelay
	for attempt := 1; attempt <= 6; attempt++ {
		if got := reconnectDelay(attempt, firstDelay, maxDelay, 0); got != ceiling/2 {
			t.Errorf("attempt %d, lowest draw: %v, want %v", attempt, got, ceiling/2)
		}
		if got := reconnectDelay(attempt, firstDelay, maxDelay, 1); got != ceiling {
			t.Errorf("attempt %d, highest draw: %v, want %v", attempt, got, ceiling)
		}
		if got := reconnectDelay(attempt, firstDelay, maxDelay, 0.5); got <= ceiling/2 || got >= ceiling {
			t.Errorf("attempt %d, middle draw: %v, want inside (%v, %v)", attempt, got, ceiling/2, ceiling)
		}
		ceiling *= 2
	}
}

func TestReconnectDelaysStopAtTheCap(t *testing.T) {
	for _, attempt := range []int{7, 8, 40, math.MaxInt} {
		if got := reconnectDelay(attempt, firstDelay, maxDelay, 1); got != maxDelay {
			t.Errorf("attempt %d, highest draw: %v, want the cap", attempt, got)
		}
		if got := reconnectDelay(attempt, firstDelay, maxDelay, 0); got != maxDelay/2 {
			t.Errorf("attempt %d, lowest draw: %v, want half the cap", attempt, got)
		}
	}
}

func TestReconnectDrawOutOfRangeStaysWithinTheDelay(t *testing.T) {
	if got := reconnectDelay(1, firstDelay, maxDelay, 7); got != firstDelay {
		t.Errorf("draw 7: %v", got)
	}
	if got := reconnectDelay(1, firstDelay, maxDelay, math.NaN()); got != firstDelay/2 {
		t.Errorf("draw NaN: %v", got)
	}
}
