package train

import (
	"encoding/json"
	"net/http"
	"slices"
	"sync"

	"github.com/zaya-operator/zaya-operator/api/contract"
)

// nodeStepSmoothing is the weight of a step's newest node timing in the moving mean that
// Progress.NodeStepSeconds reports: about the last ten steps count, so one slow step (a
// checkpoint snapshot, a page fault) does not make a straggler.
const nodeStepSmoothing = 0.2

// board is rank 0's live account of the run (contract.Progress), which the operator polls at
// contract.ProgressPath on the metrics server.
type board struct {
	mu sync.Mutex
	p  contract.Progress
}

func (b *board) set(p contract.Progress) {
	b.mu.Lock()
	defer b.mu.Unlock()
	p.NodeStepSeconds = slices.Clone(p.NodeStepSeconds)
	b.p = p
}

func (b *board) get() contract.Progress {
	b.mu.Lock()
	defer b.mu.Unlock()
	p := b.p
	p.NodeStepSeconds = slices.Clone(p.NodeStepSeconds)
	return p
}

func (b *board) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet {
		http.Error(w, "GET only", http.StatusMethodNotAllowed)
		return
	}
	body, err := json.Marshal(b.get())
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(body)
}

// smoothNodes folds one step's per-node busy seconds into the moving means.
func smoothNodes(means, step []float64) []float64 {
	if len(means) != len(step) {
		return slices.Clone(step)
	}
	for i, v := range step {
		means[i] += nodeStepSmoothing * (v - means[i])
	}
	return means
}
