//go:build race

package bench

// raceOn: the race detector is on, and costs several times the memory
// and time of a plain build.
const raceOn = true
