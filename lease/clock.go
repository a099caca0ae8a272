package lease

import "time"

// clock is the session's source of local time. Safety never depends on it
// (the fence does), but the early loss signal does; tests replace it to run
// the library's clock slow or fast.
type clock interface {
	Now() time.Time
	NewTimer(d time.Duration) timer
}

type timer interface {
	C() <-chan time.Time
	Reset(d time.Duration)
	Stop()
}

type realClock struct{}

func (realClock) Now() time.Time { return time.Now() }

func (realClock) NewTimer(d time.Duration) timer { return realTimer{time.NewTimer(d)} }

type realTimer struct{ t *time.Timer }

func (t realTimer) C() <-chan time.Time   { return t.t.C }
func (t realTimer) Reset(d time.Duration) { t.t.Reset(d) }
func (t realTimer) Stop()                 { t.t.Stop() }

// scaledClock runs at rate times real time from its creation: the seam for
// the fault suite's slow and fast clocks.
type scaledClock struct {
	origin time.Time
	rate   float64
}

func newScaledClock(rate float64) scaledClock { return scaledClock{origin: time.Now(), rate: rate} }

func (c scaledClock) Now() time.Time {
	return c.origin.Add(time.Duration(float64(time.Since(c.origin)) * c.rate))
}

func (c scaledClock) NewTimer(d time.Duration) timer {
	return scaledTimer{realTimer{time.NewTimer(c.real(d))}, c}
}

func (c scaledClock) real(d time.Duration) time.Duration { return time.Duration(float64(d) / c.rate) }

type scaledTimer struct {
	realTimer
	c scaledClock
}

func (t scaledTimer) Reset(d time.Duration) { t.realTimer.Reset(t.c.real(d)) }
