package train

import (
	"context"
	"fmt"
	"time"

	"github.com/zaya-operator/zaya-operator/api/contract"
	"github.com/zaya-operator/zaya-operator/workers/exactsum"
	"github.com/zaya-operator/zaya-operator/workers/model"
	"github.com/zaya-operator/zaya-operator/workers/ring"
)

// vecGrads is how many gradients the step's all-reduce vector carries: none when the device
// sums them itself.
func (r *rankState) vecGrads() int {
	if r.devReduce {
		return 0
	}
	return r.n
}

// processStart is when this process started, for its progress report.
var processStart = time.Now()

// startTraining starts the clocks of throughput and time-based checkpoints.
func (r *rankState) startTraining() {
	r.start, r.resumed = time.Now(), r.res.Step
	r.res.TrainingSince = r.start
	r.lastSave = time.Now()
}

// stopVote is what the step's all-reduce said about stopping: how many ranks were signalled
// and the sum of their ranks (the rank itself when only one was).
type stopVote struct{ count, rankSum int }

// step trains one step in lockstep with every rank and returns the ranks' stop and save calls.
func (r *rankState) step(ctx context.Context) (stop stopVote, periodDue bool, err error) {
	began := time.Now()
	if r.cfg.Pace > 0 {
		time.Sleep(r.cfg.Pace) // before the step's all-reduce, so every rank keeps the pace
	}
	vec, err := r.gradients()
	if err != nil {
		return stop, false, err
	}
	if r.cfg.slow != nil && r.cfg.slow.Load() {
		time.Sleep(max(time.Since(began), 20*time.Millisecond))
	}
	// What kept this rank busy before it met the others: a straggler's is the largest.
	vec[6+r.vecGrads()+r.cfg.NodeRank] += time.Since(began).Seconds() / float64(r.cfg.GPUsPerNode)
	if err := r.vote(ctx, vec); err != nil {
		return stop, false, err
	}
	if err := r.tr.AllReduce(vec); err != nil {
		return stop, false, fmt.Errorf("rank %d step %d: all-reduce: %w", r.rank, r.res.Step, err)
	}
	r.unscale(vec)
	if err := r.apply(vec); err != nil {
		return stop, false, err
	}
	if r.rank == 0 {
		r.nodeBusy = smoothNodes(r.nodeBusy, vec[6+r.vecGrads():])
	}
	r.report()
	n := r.vecGrads()
	return stopVote{int(vec[1+n]), int(vec[5+n])}, vec[4+n] > 0, nil
}

// gradients puts this rank's loss and weight gradients of the step into a new all-reduce vector.
// They are summed exactly (exactsum): every micro-batch's loss and gradients are rounded once
// to a grid the ranks agree on, so the all-reduce's sum, turned back by unscale, has the same
// bits whatever the width and the order of the additions.
func (r *rankState) gradients() ([]float64, error) {
	cfg, n := &r.cfg, r.vecGrads()
	// One all-reduce carries the loss, the weight gradients, the stop vote, whether this
	// rank's background save is written, the last step rank 0 committed, and rank 0's call
	// (by its clock) that a time-based checkpoint is due after this step, and the sum of the
	// signalled ranks (see vote); then each node's busy seconds (see step).
	vec := make([]float64, 6+n+cfg.Nodes)
	// Micro-batch k of the step is the data of data-parallel group k at the target width;
	// this rank's group trains every micro-batch k ≡ dp (mod this run's groups).
	var terms [][]float64 // per micro-batch: the loss over r.norm, then the gradients
	for k := r.dp; k < r.micro; k += r.dpGroups {
		tokens := model.Tokens(cfg.Seed, r.res.Step, k, cfg.Seq, r.shape.Vocab)
		b := model.Batch{Norm: r.norm}
		for _, p := range r.pos {
			b.Inputs, b.Targets = append(b.Inputs, tokens[p]), append(b.Targets, tokens[p+1])
		}
		term := make([]float64, 1+n)
		var loss float64
		var err error
		switch {
		case r.devReduce:
			loss, err = r.dev.GradReduced(b)
		case r.dev != nil:
			loss, err = r.dev.Grad(b, term[1:])
		default:
			att := model.Ring{Backend: r.be, Layout: r.layout, Rank: r.cpRank, KV: ring.Over(r.tr), Blocks: ring.OverBlocks(r.tr)}
			loss, err = r.shape.Grad(r.params, b, att, model.BF16, term[1:])
		}
		if err != nil {
			return nil, fmt.Errorf("rank %d step %d: %w", r.rank, r.res.Step, err)
		}
		term[0] = loss / r.norm
		terms = append(terms, term)
	}
	// The grids: the largest loss and the largest gradient of any term on any rank.
	largest := []float64{0, 0}
	for _, term := range terms {
		largest[0] = max(largest[0], exactsum.MaxAbs(term[:1]))
		largest[1] = max(largest[1], exactsum.MaxAbs(term[1:]))
	}
	if err := exactsum.AllMax(r.tr, largest); err != nil {
		return nil, fmt.Errorf("rank %d step %d: the gradients' scale: %w", r.rank, r.res.Step, err)
	}
	count := r.micro * cfg.ContextParallel // every micro-batch's loss is split over its ring
	for i, m := range largest {
		e, err := exactsum.Exponent(m, count)
		if err != nil {
			return nil, fmt.Errorf("rank %d step %d: the %s: %w", r.rank, r.res.Step, []string{"loss", "gradients"}[i], err)
		}
		r.scales[i] = e
	}
	for _, term := range terms {
		exactsum.Add(vec[:1], term[:1], r.scales[0])
		exactsum.Add(vec[1:1+n], term[1:], r.scales[1])
	}
	return vec, nil
}

// unscale turns the all-reduced loss and gradients of vec back into values.
func (r *rankState) unscale(vec []float64) {
	exactsum.Unscale(vec[:1], r.scales[0])
	exactsum.Unscale(vec[1:1+r.vecGrads()], r.scales[1])
}

// vote adds the stop vote, the background save's state and rank 0's checkpoint calls to vec.
func (r *rankState) vote(ctx context.Context, vec []float64) error {
	n := r.vecGrads()
	if ctx.Err() != nil {
		vec[1+n], vec[5+n] = 1, float64(r.rank)
	}
	if r.pending != nil {
		if written, err := r.pending.written(); err != nil {
			return err
		} else if written {
			vec[2+n] = 1
		}
	}
	if r.rank == 0 {
		vec[3+n] = float64(r.res.CheckpointStep)
		if r.cfg.CheckpointPeriod > 0 && time.Since(r.lastSave) >= r.cfg.CheckpointPeriod {
			vec[4+n] = 1
		}
	}
	return nil
}

// apply commits a background save every rank has written and updates the parameters.
func (r *rankState) apply(vec []float64) error {
	n := r.vecGrads()
	r.res.CheckpointStep = max(r.res.CheckpointStep, int64(vec[3+n]))
	if r.pending != nil && int(vec[2+n]) == r.world {
		// Every rank's shard is on disk: rank 0 commits, the others hear of it next step.
		if r.rank == 0 {
			if err := commit(r.cfg, r.world, r.pending.step); err != nil {
				return err
			}
			r.res.CheckpointStep = r.pending.step
		}
		r.pending = nil
	}
	update := func() error { return r.opt.Update(r.shape, r.params, r.adamM, r.adamV, vec[1:1+n], r.res.Step+1) }
	switch {
	case r.devReduce:
		update = func() error { return r.dev.UpdateReduced(r.opt, r.res.Step+1) }
	case r.dev != nil:
		update = func() error { return r.dev.Update(r.opt, r.res.Step+1, vec[1:1+n]) }
	}
	if err := update(); err != nil {
		return fmt.Errorf("rank %d step %d: %w", r.rank, r.res.Step, err)
	}
	r.res.Step++
	r.res.Loss = vec[0]
	return nil
}

// report touches the heartbeat and publishes the step's progress in metrics and the log.
func (r *rankState) report() {
	cfg, res := &r.cfg, &r.res
	local0 := r.local == 0 // reports this process's metrics
	if cfg.HeartbeatFile != "" {
		touch(cfg.HeartbeatFile)
	}
	res.LastStepAt = time.Now()
	if r.local == 0 && cfg.board != nil { // every node answers; rank 0 also times the nodes
		cfg.board.set(contract.Progress{
			Step: res.Step, ResumedFrom: r.resumed, CheckpointStep: res.CheckpointStep,
			StepSeconds:   time.Since(r.start).Seconds() / float64(max(res.Step-r.resumed, 1)),
			TrainingSince: r.start, LastStepAt: res.LastStepAt, NodeStepSeconds: r.nodeBusy,
			StartedAt: processStart, MetAt: r.met,
		})
	}
	if local0 && cfg.Metrics != nil {
		cfg.Metrics.Step.Set(float64(res.Step))
		cfg.Metrics.Loss.Set(res.Loss)
		cfg.Metrics.TokensPerSec.Set(float64(int64(cfg.Seq*r.micro)*(res.Step-r.resumed)) / time.Since(r.start).Seconds())
	}
	if r.rank == 0 && (res.Step%int64(max(cfg.LogEvery, 1)) == 0 || res.Step == int64(cfg.Steps)) {
		tokens := float64(int64(cfg.Seq*r.micro)*(res.Step-r.resumed)) / time.Since(r.start).Seconds()
		_, _ = fmt.Fprintf(cfg.Log, "step %d loss %.6g tokens/s %.0f at %s\n", res.Step, res.Loss, tokens, res.LastStepAt.UTC().Format(time.RFC3339Nano))
	}
	if local0 && cfg.Metrics != nil {
		cfg.Metrics.CheckpointStep.Set(float64(res.CheckpointStep))
	}
}
