"""What the PyTorch sides of the CPU benchmarks share (torch_cross_entropy.py, torch_softmax.py,
torch_gelu.py, torch_layer_norm.py, torch_lm_head.py, torch_generate.py, torch_gpt2_autocast.py):
the warm-up and timing loop, the common flags, and the JSON line each workload prints in the
shape of the mumoe benchmarks (experiments/bench/timing.h), which compare.sh reads.
"""
import argparse
import json
import statistics
import time

import torch


def timed(step, reps, warmup):
    """The times of `reps` calls of step() in ms, after `warmup` untimed ones."""
    for _ in range(warmup):
        step()
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        step()
        ts.append((time.perf_counter() - t0) * 1e3)
    return ts


def parser(doc, reps, warmup=3):
    """An argument parser with --threads (default 2), --reps and --warmup."""
    p = argparse.ArgumentParser(description=doc)
    p.add_argument('--threads', type=int, default=2)
    p.add_argument('--reps', type=int, default=reps)
    p.add_argument('--warmup', type=int, default=warmup)
    return p


def start(a):
    """The parsed flags' thread count, and seed 0, as the mumoe benchmarks."""
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)


def report(workload, ts, threads, nbytes=None, impl='pytorch', **fields):
    """One workload's line: its median, min and max over the times ts (ms); with nbytes (the
    bytes a step must move at least) also those and the rate they imply at the median; then
    any further fields as given."""
    med = statistics.median(ts)
    line = {'workload': workload, 'impl': impl, 'threads': threads, 'median_ms': round(med, 3),
            'min_ms': round(min(ts), 3), 'max_ms': round(max(ts), 3)}
    if nbytes is not None:
        line.update(bytes=nbytes, gbps=round(nbytes / (med * 1e-3) / 1e9, 2))
    line.update(fields)
    print(json.dumps(line), flush=True)
