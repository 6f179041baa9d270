package train

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"path/filepath"
	"strconv"

	"github.com/zaya-operator/zaya-operator/api/contract"
	"github.com/zaya-operator/zaya-operator/workers/checkpoint"
	"github.com/zaya-operator/zaya-operator/workers/model"
	"github.com/zaya-operator/zaya-operator/workers/transport"
)

// resume restores the newest step whose every part verifies, agreed by every rank: rank 0
// proposes the steps newest first, each rank opens the manifest and reads and verifies only
// its own slice of the parameters (so the step is read about once in total), and the ranks
// vote through an all-reduce. A committed step that fails is moved aside by rank 0, so the
// gang can save that step number again instead of being refused forever; a step without a
// manifest is an unfinished save and is skipped. The ranks then share their slices.
func (r *rankState) resume() error {
	dir := r.cfg.CheckpointDir
	if dir == "" {
		return nil
	}
	var steps []int64
	var fenced error
	if r.rank == 0 {
		// Before reading anything: from now on no writer of an older attempt can publish or
		// delete a step here, neither a stale pod of an older generation nor a process of
		// this generation's run before an in-place restart (each start numbers anew).
		attempt, err := checkpoint.FenceNext(dir, r.cfg.JobUID, r.cfg.Attempt)
		switch {
		case errors.Is(err, checkpoint.ErrFenced):
			fenced = err
		case err != nil:
			return err
		}
		if fenced == nil {
			if steps, err = checkpoint.Steps(dir); err != nil {
				return err
			}
			r.cfg.Attempt = attempt
		}
	}
	for i := 0; ; i++ {
		// Rank 0's proposal, as step+1 (0: no step left, a fresh start); whether a newer
		// attempt owns the directory; and the attempt number every rank writes under: the one
		// rank 0 fenced the directory with (this start's within its generation, offset past an
		// earlier job's when this job took the volume over; at most 2^53, exact in a float64).
		prop := []float64{0, 0, 0}
		if r.rank == 0 {
			prop[2] = float64(r.cfg.Attempt)
			if i < len(steps) {
				prop[0] = float64(steps[i] + 1)
			}
		}
		if fenced != nil {
			prop[1] = 1
		}
		if err := r.tr.AllReduce(prop); err != nil {
			return fmt.Errorf("rank %d resuming: %w", r.rank, err)
		}
		r.cfg.Attempt = int(prop[2])
		if prop[1] > 0 {
			// This pod is stale (a newer attempt of its job started): restarting cannot
			// help, so every rank says so.
			if fenced == nil {
				fenced = errors.New("rank 0 found it fenced by a newer attempt")
			}
			return &ConfigError{fmt.Sprintf("%s=%d: %v: a newer attempt of this job owns %s",
				contract.EnvRestartAttempt, r.cfg.Attempt, fenced, dir)}
		}
		step := int64(prop[0]) - 1
		if step < 0 {
			r.restored(0)
			return nil
		}
		lo, parts, outcome, err := r.verifyPart(step)
		vote := make([]float64, partOK) // ranks that found it corrupt, not committed, not fitting, unreadable
		if outcome != partOK {
			vote[outcome] = 1
		}
		if err := r.tr.AllReduce(vote); err != nil {
			return fmt.Errorf("rank %d resuming: %w", r.rank, err)
		}
		switch {
		case vote[partMisfit] > 0:
			if err == nil {
				err = fmt.Errorf("another rank found it does not fit")
			}
			return &ConfigError{fmt.Sprintf("checkpoint at step %d does not fit this model: %v", step, err)}
		case vote[partCorrupt] > 0:
			if err := r.dropCorrupt(step, err); err != nil {
				return err
			}
			continue
		case vote[partUnreadable] > 0:
			// Storage that cannot be read now is no reason to give up a step: fail, and
			// let the restarted gang try again.
			return fmt.Errorf("rank %d: checkpoint step %d could not be read by %.0f rank(s) (this one: %w)", r.rank, step, vote[partUnreadable], err)
		case vote[partUncommitted] > 0:
			if r.rank == 0 {
				_, _ = fmt.Fprintf(r.cfg.Log, "skipping checkpoint step %d: not committed\n", step)
			}
			continue
		}
		for i, t := range r.state() {
			whole, err := r.gather(lo, parts[i])
			if err != nil {
				return err
			}
			copy(t.data, whole)
		}
		if r.dev != nil {
			if err := r.dev.Load(r.params, r.adamM, r.adamV); err != nil {
				return rocmError(err)
			}
		}
		r.res.Step, r.res.CheckpointStep, r.cfg.restored = step, step, step
		if r.rank == 0 {
			_, _ = fmt.Fprintf(r.cfg.Log, "resumed from step %d\n", step)
		}
		r.restored(step)
		return nil
	}
}

// What a rank found when it verified its part of a step.
const (
	partCorrupt = iota
	partUncommitted
	partMisfit
	partUnreadable
	partOK
)

// verifyPart opens step's manifest and reads and verifies this rank's slice of every tensor
// of the state (parts in state() order).
func (r *rankState) verifyPart(step int64) (lo int64, parts [][]float32, outcome int, err error) {
	n := int64(r.n)
	lo, hi := n*int64(r.rank)/int64(r.world), n*int64(r.rank+1)/int64(r.world)
	ck, err := checkpoint.Open(r.cfg.CheckpointDir, step)
	switch {
	case errors.Is(err, checkpoint.ErrNotCommitted):
		return lo, nil, partUncommitted, err
	case errors.Is(err, checkpoint.ErrCorrupt):
		return lo, nil, partCorrupt, err
	case err != nil:
		return lo, nil, partUnreadable, err
	}
	// The shape first: sizes can trade off (vocabulary against MLP width) and the heads do
	// not change the count at all.
	if saved, ok := ck.Manifest.State[modelStateKey]; ok && saved != describe(r.shape) {
		return lo, nil, partMisfit, fmt.Errorf("it was saved by a model of %s, this one has %s", saved, describe(r.shape))
	}
	for _, t := range r.state() {
		switch got := ck.Elements(t.name); {
		case got < 0:
			return lo, nil, partMisfit, fmt.Errorf("it has no %q tensor (a checkpoint of another model: this one (%s) keeps params, adam.m and adam.v)", t.name, describe(r.shape))
		case got != n:
			return lo, nil, partMisfit, fmt.Errorf("its %q holds %d values, this model (%s) has %d parameters", t.name, got, describe(r.shape), n)
		}
	}
	for _, t := range r.state() {
		part, err := ck.Read(t.name, lo, hi-lo)
		if errors.Is(err, checkpoint.ErrCorrupt) {
			return lo, nil, partCorrupt, err
		}
		if err != nil {
			return lo, nil, partUnreadable, err
		}
		parts = append(parts, part)
	}
	return lo, parts, partOK, nil
}

// modelStateKey names the model's shape in a checkpoint's manifest state.
const modelStateKey = "model"

func describe(s model.Shape) string {
	return fmt.Sprintf("vocab %d, dim %d, layers %d, heads %d, ffn %d", s.Vocab, s.Dim, s.Layers, s.Heads, s.FFN)
}

// dropCorrupt is the ranks' common decision on a step some rank found corrupt: rank 0
// verifies the whole step to learn why and moves it aside; if it finds nothing wrong, or
// only storage it cannot read, the step is kept and the gang fails (a node that cannot read
// good data must not destroy it).
func (r *rankState) dropCorrupt(step int64, own error) error {
	decision := []float64{0} // 1: moved aside, 2: rank 0 found it good
	if r.rank == 0 {
		reason := own
		if !errors.Is(reason, checkpoint.ErrCorrupt) {
			ck, err := checkpoint.Open(r.cfg.CheckpointDir, step)
			if err == nil {
				err = ck.Verify()
			}
			reason = err
		}
		decision[0] = 2
		if errors.Is(reason, checkpoint.ErrCorrupt) {
			to, err := checkpoint.MoveAside(r.cfg.CheckpointDir, step, reason.Error())
			if err != nil {
				return fmt.Errorf("moving corrupt step %d aside: %w", step, err)
			}
			decision[0] = 1
			_, _ = fmt.Fprintf(r.cfg.Log, "checkpoint step %d is corrupt, moved to %s: %v\n", step, to, reason)
			if r.cfg.TerminationLog != "" {
				r.cfg.report.add(fmt.Sprintf("%s step=%d moved to %s: %s", contract.TerminationMessageCorruptPrefix, step, filepath.Base(to), truncate(reason.Error(), 300)))
			}
		}
	}
	if err := r.tr.AllReduce(decision); err != nil {
		return fmt.Errorf("rank %d resuming: %w", r.rank, err)
	}
	if decision[0] != 1 {
		return fmt.Errorf("rank %d: checkpoint step %d failed verification on some rank but rank 0 found no corruption: %w", r.rank, step, own)
	}
	// Every pod says so: the operator may see only the pod that fails next, not rank 0's.
	if r.rank != 0 && r.local == 0 && r.cfg.TerminationLog != "" {
		r.cfg.report.add(fmt.Sprintf("%s step=%d moved aside by rank 0", contract.TerminationMessageCorruptPrefix, step))
	}
	return nil
}

// gather gives every rank the whole parameters from each rank's verified slice, bit for bit:
// an all-gather of the bytes where the transport has one, else an all-reduce of the float32
// bits (as exact float64 integers, every other rank adding zero), so no bit changes, the
// sign of zero and NaN payloads included.
func (r *rankState) gather(lo int64, part []float32) ([]float32, error) {
	if r.world == 1 {
		return part, nil
	}
	if g, ok := r.tr.(transport.Gatherer); ok {
		b := make([]byte, 4*len(part))
		for i, x := range part {
			binary.LittleEndian.PutUint32(b[4*i:4*i+4], math.Float32bits(x))
		}
		parts, err := g.AllGather(b)
		if err != nil {
			return nil, fmt.Errorf("rank %d sharing restored parameters: %w", r.rank, err)
		}
		out := make([]float32, r.n)
		n := int64(r.n)
		for k, p := range parts {
			klo := n * int64(k) / int64(r.world)
			dst := out[klo : n*int64(k+1)/int64(r.world)]
			if len(p) != 4*len(dst) {
				return nil, fmt.Errorf("rank %d sharing restored parameters: rank %d sent %d bytes, want %d", r.rank, k, len(p), 4*len(dst))
			}
			for i := range dst {
				dst[i] = math.Float32frombits(binary.LittleEndian.Uint32(p[4*i : 4*i+4]))
			}
		}
		return out, nil
	}
	vec := make([]float64, r.n)
	for i, x := range part {
		vec[lo+int64(i)] = float64(math.Float32bits(x))
	}
	if err := r.tr.AllReduce(vec); err != nil {
		return nil, fmt.Errorf("rank %d sharing restored parameters: %w", r.rank, err)
	}
	out := make([]float32, r.n)
	for i, v := range vec {
		out[i] = math.Float32frombits(uint32(v))
	}
	return out, nil
}

// restored tells the operator, once per process, which step training goes on from (0: none).
func (r *rankState) restored(step int64) {
	if r.local == 0 && r.cfg.TerminationLog != "" {
		r.cfg.report.add(contract.TerminationMessageRestoredPrefix + strconv.FormatInt(step, 10))
	}
}
