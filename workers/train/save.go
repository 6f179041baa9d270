package train

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/zaya-operator/zaya-operator/workers/checkpoint"
	"github.com/zaya-operator/zaya-operator/workers/transport"
)

// pull copies the device's weights and moments to the host before they are saved.
func (r *rankState) pull() error {
	if r.dev == nil {
		return nil
	}
	p, m, v, err := r.dev.State()
	if err != nil {
		return fmt.Errorf("rank %d: copying the state from the device: %w", r.rank, err)
	}
	copy(r.params, p)
	copy(r.adamM, m)
	copy(r.adamV, v)
	return nil
}

// state is what a checkpoint holds besides the step: the master weights and AdamW's moments
// (the step count is the checkpoint's step), so a resumed run goes on bit for bit.
func (r *rankState) state() []tensor {
	return []tensor{{"params", r.params}, {"adam.m", r.adamM}, {"adam.v", r.adamV}}
}

// saveAndStop checkpoints the step the ranks agreed to stop after and returns why they stopped:
// always a StoppedError, also on a rank nobody signalled, so that no rank reports a run it
// did not finish as done.
func (r *rankState) saveAndStop(ctx context.Context, vote stopVote) error {
	if err := finishSave(r.cfg, r.tr, r.rank, r.world, &r.pending, &r.res); err != nil {
		return err
	}
	if r.cfg.CheckpointDir != "" {
		if err := r.pull(); err != nil {
			return err
		}
		if err := save(r.cfg, r.tr, r.rank, r.world, r.res.Step, r.state()); err != nil {
			return err
		}
		r.res.CheckpointStep = r.res.Step
	}
	why := fmt.Sprintf("%d ranks were stopped at step %d", vote.count, r.res.Step)
	switch {
	case ctx.Err() != nil:
		why = fmt.Sprintf("rank %d was signalled at step %d", r.rank, r.res.Step)
	case vote.count == 1:
		why = fmt.Sprintf("peer rank %d was stopped at step %d", vote.rankSum, r.res.Step)
	}
	return &StoppedError{Step: r.res.Step, Why: why, err: ctx.Err()}
}

// checkpointIfDue starts a background save when the step or time interval says so.
func (r *rankState) checkpointIfDue(periodDue bool) error {
	cfg := r.cfg
	due := (cfg.CheckpointEvery > 0 && r.res.Step%int64(cfg.CheckpointEvery) == 0) || periodDue
	if cfg.CheckpointDir == "" || !due {
		return nil
	}
	r.lastSave = time.Now()
	// A save still in flight is finished first: storage slower than the interval then
	// holds training rather than let a fault lose more than one interval.
	began := time.Now()
	if err := finishSave(cfg, r.tr, r.rank, r.world, &r.pending, &r.res); err != nil {
		return err
	}
	if err := r.pull(); err != nil {
		return err
	}
	r.pending = startSave(cfg, r.rank, r.world, r.res.Step, r.state())
	if r.local == 0 && cfg.Metrics != nil {
		cfg.Metrics.SaveSeconds.Observe(time.Since(began).Seconds())
	}
	return nil
}

// inflight is a checkpoint being written in the background from a snapshot of the parameters.
type inflight struct {
	step int64
	done chan error
	ok   bool
}

// written reports, without blocking, whether this rank's shard is on disk.
func (f *inflight) written() (bool, error) {
	if f.ok {
		return true, nil
	}
	select {
	case err := <-f.done:
		if err != nil {
			return false, err
		}
		f.ok = true
	default:
	}
	return f.ok, nil
}

// startSave snapshots this rank's slice of the state and writes it in the background, so
// training does not wait on storage; the commit follows once every rank reports its shard.
func startSave(cfg Config, rank, world int, step int64, state []tensor) *inflight {
	shard := shardOf(rank, world, state)
	for i := range shard {
		shard[i].Data = slices.Clone(shard[i].Data)
	}
	f := &inflight{step: step, done: make(chan error, 1)}
	go func() {
		f.done <- checkpoint.WriteShard(cfg.CheckpointDir, cfg.Attempt, step, rank, shard)
	}()
	return f
}

// shardOf is rank's slice of every tensor of the state, sharing its storage.
func shardOf(rank, world int, state []tensor) []checkpoint.Tensor {
	var out []checkpoint.Tensor
	for _, t := range state {
		n := int64(len(t.data))
		lo, hi := n*int64(rank)/int64(world), n*int64(rank+1)/int64(world)
		out = append(out, checkpoint.Tensor{Name: t.name, Shape: []int64{n}, Start: lo, Data: t.data[lo:hi]})
	}
	return out
}

// finishSave completes a background save in step with the other ranks (every rank has the
// same pending save: the all-reduce decided it), committing it before the ranks stop.
func finishSave(cfg Config, tr transport.Transport, rank, world int, pending **inflight, res *Result) error {
	f := *pending
	if f == nil {
		return nil
	}
	*pending = nil
	if !f.ok { // written() has not seen the write finish: wait for it
		if err := <-f.done; err != nil {
			return err
		}
	}
	if err := tr.Barrier(); err != nil {
		return err
	}
	if rank == 0 {
		if err := commit(cfg, world, f.step); err != nil {
			return err
		}
	}
	if err := tr.Barrier(); err != nil {
		return err
	}
	res.CheckpointStep = f.step
	return nil
}

func commit(cfg Config, world int, step int64) error {
	state := map[string]string{"step": strconv.FormatInt(step, 10), modelStateKey: describe(cfg.shape())}
	if _, err := checkpoint.Commit(cfg.CheckpointDir, cfg.Attempt, step, world, state,
		checkpoint.Retention{Keep: cfg.Keep, Protect: cfg.restored}); err != nil {
		return err
	}
	_, _ = fmt.Fprintf(cfg.Log, "checkpoint step %d committed\n", step)
	return nil
}

// save writes this rank's slice of the state; rank 0 commits once every rank has.
func save(cfg Config, tr transport.Transport, rank, world int, step int64, state []tensor) error {
	if err := checkpoint.WriteShard(cfg.CheckpointDir, cfg.Attempt, step, rank, shardOf(rank, world, state)); err != nil {
		return fmt.Errorf("rank %d writing its shard of step %d: %w", rank, step, err)
	}
	if err := tr.Barrier(); err != nil {
		return err
	}
	if rank == 0 {
		if err := commit(cfg, world, step); err != nil {
			return err
		}
	}
	return tr.Barrier() // nobody reports a step as committed before it is
}
