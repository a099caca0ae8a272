//go:build race

package lease_test

// raceDetector tells that the tests run under the race detector, which
// slows the embedded etcd down several times.
const raceDetector = true
