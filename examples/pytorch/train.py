"""A small DDP training script, written as a user would write one for torchrun.

Synthetic data, a few-layer model, gloo on CPU. Rank 0 saves a checkpoint into
ZAYA_CHECKPOINT_DIR every ZAYA_CHECKPOINT_INTERVAL steps and every rank resumes from the
newest one. Each node's first process writes its step and newest checkpoint to
ZAYA_PROGRESS_FILE, which zaya-supervisor reports to the operator. It reads nothing of
zaya-operator's but the worker contract's environment, and imports nothing of it:

    torchrun train.py --steps 200

torchrun takes its flags from the PET_* variables the operator sets (nodes, node rank,
processes per node, the rendezvous address).
"""

import argparse
import datetime
import glob
import os
import re
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel


def newest_checkpoint(directory):
    """The (step, path) of the newest ckpt-<step>.pt in directory, or None."""
    found = None
    for path in glob.glob(os.path.join(directory, "ckpt-*.pt")):
        m = re.fullmatch(r"ckpt-(\d+)\.pt", os.path.basename(path))
        if m and (found is None or int(m[1]) > found[0]):
            found = (int(m[1]), path)
    return found


def save(directory, step, model, optimizer, keep):
    """Writes ckpt-<step>.pt whole or not at all, and keeps the newest `keep`."""
    path = os.path.join(directory, f"ckpt-{step}.pt")
    torch.save({"step": step, "model": model.state_dict(), "optimizer": optimizer.state_dict()}, path + ".tmp")
    os.replace(path + ".tmp", path)
    steps = sorted(int(m[1]) for p in glob.glob(os.path.join(directory, "ckpt-*.pt"))
                   if (m := re.fullmatch(r"ckpt-(\d+)\.pt", os.path.basename(p))))
    for old in steps[:-keep]:
        os.remove(os.path.join(directory, f"ckpt-{old}.pt"))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--step-seconds", type=float, default=0.05, help="sleep per step, to pace the run")
    args = parser.parse_args()

    timeout = datetime.timedelta(seconds=int(os.environ.get("ZAYA_COLLECTIVE_TIMEOUT", "1800")))
    dist.init_process_group("gloo", timeout=timeout)
    rank, world = dist.get_rank(), dist.get_world_size()

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

    directory = os.environ.get("ZAYA_CHECKPOINT_DIR")
    interval = os.environ.get("ZAYA_CHECKPOINT_INTERVAL", "50")
    every = int(interval) if interval.isdigit() else 50  # a duration ("30m0s"): every 50 steps
    keep = int(os.environ.get("ZAYA_CHECKPOINT_KEEP", "3"))
    start = 0
    if directory:
        found = newest_checkpoint(directory)
        if found:
            state = torch.load(found[1])
            model.load_state_dict(state["model"])
            optimizer.load_state_dict(state["optimizer"])
            start = state["step"]
    # Every rank starts where rank 0 does (its view of the directory decides).
    step = torch.tensor([start])
    dist.broadcast(step, 0)
    start = int(step)
    print(f"rank {rank} of {world}: starting at step {start}", flush=True)

    # zaya-supervisor serves these two lines to the operator and reports them when the
    # process exits (docs/worker-contract.md, "Progress"): without them the operator knows
    # only when the pods ran, so it cannot tell when training resumed nor price the steps a
    # restart trains again. One process per node writes them: first the checkpoint it resumed
    # from, then after every step.
    progress = os.environ.get("ZAYA_PROGRESS_FILE") if os.environ.get("LOCAL_RANK", "0") == "0" else None

    def report(step, checkpoint):
        if progress:
            with open(progress, "w") as f:
                f.write(f"step={step}\ncheckpoint={checkpoint}\n")

    committed = start
    report(start, committed)

    ddp = DistributedDataParallel(model)
    for step in range(start + 1, args.steps + 1):
        data = torch.Generator().manual_seed(step * world + rank)
        x = torch.randn(16, 32, generator=data)
        loss = nn.functional.mse_loss(ddp(x), x.sum(dim=1, keepdim=True))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if rank == 0:
            print(f"step {step} loss {loss.item():.4f}", flush=True)
            if directory and step % every == 0:
                save(directory, step, model, optimizer, keep)
        if directory:
            # Rank 0 saved the step before this one's, if due, before it joined this step's
            # all-reduce: the other ranks know it committed only now.
            committed = max(start, (step if rank == 0 else step - 1) // every * every)
        report(step, committed)
        time.sleep(args.step_seconds)

    dist.destroy_process_group()
    print(f"rank {rank}: done at step {args.steps}", flush=True)


if __name__ == "__main__":
    main()
