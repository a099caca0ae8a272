package chaos

import (
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/anishathalye/porcupine"
)

// History records operations from many clients, with times from one
// monotonic clock. It is safe for concurrent use.
type History struct {
	start time.Time
	mu    sync.Mutex
	ops   []porcupine.Operation
}

// NewHistory starts an empty history.
func NewHistory() *History { return &History{start: time.Now()} }

// Now is the history's clock.
func (h *History) Now() int64 { return int64(time.Since(h.start)) }

// Add records one operation that was called at call. An operation of
// unknown outcome is recorded as lasting forever: it may take effect at
// any later time.
func (h *History) Add(client int, in Input, call int64, out Output) {
	ret := h.Now()
	if out.Outcome == Unknown {
		ret = math.MaxInt64
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.ops = append(h.ops, porcupine.Operation{ClientId: client, Input: in, Call: call, Output: out, Return: ret})
}

// Operations returns a copy of what was recorded.
func (h *History) Operations() []porcupine.Operation {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]porcupine.Operation(nil), h.ops...)
}

// Check runs porcupine over the history. Anything but Ok (Illegal, or
// Unknown when the checker ran out of time) is a failure.
func (h *History) Check(timeout time.Duration) (porcupine.CheckResult, porcupine.LinearizationInfo) {
	return porcupine.CheckOperationsVerbose(Model(), h.Operations(), timeout)
}

// Save writes the history as JSON and porcupine's visualization as HTML
// into a new folder under dir and returns the folder.
func (h *History) Save(dir, name string, info porcupine.LinearizationInfo) (string, error) {
	folder, err := os.MkdirTemp(dir, name+"-")
	if err != nil {
		return "", err
	}
	type op struct {
		Client       int
		Input        Input
		Call, Return int64
		Outcome      string
		Value        string
	}
	var ops []op
	for _, o := range h.Operations() {
		out := o.Output.(Output)
		ops = append(ops, op{o.ClientId, o.Input.(Input), o.Call, o.Return, out.Outcome.String(), out.Value})
	}
	b, err := json.MarshalIndent(ops, "", "  ")
	if err != nil {
		return "", err
	}
	if err := os.WriteFile(filepath.Join(folder, "history.json"), b, 0o644); err != nil {
		return "", err
	}
	return folder, porcupine.VisualizePath(Model(), info, filepath.Join(folder, "history.html"))
}

// opAt builds an operation with given times, for tests of the model.
func opAt(client int, in Input, out Output, call, ret int64) porcupine.Operation {
	if out.Outcome == Unknown {
		ret = math.MaxInt64
	}
	return porcupine.Operation{ClientId: client, Input: in, Call: call, Output: out, Return: ret}
}
