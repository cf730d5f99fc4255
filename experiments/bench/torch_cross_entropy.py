#!/usr/bin/python3
"""PyTorch side of bench_cross_entropy: the same workloads, in the same JSON shape.

    /usr/bin/python3 experiments/bench/torch_cross_entropy.py [--threads 2] [--reps 20]

cross-entropy-fwd: F.cross_entropy(x, t) under no_grad; cross-entropy-fwd-bwd: one step,
x.grad = None then F.cross_entropy(x, t).backward(), with x (N, C) float32 requiring
grad, t int64 targets, mean reduction. The median of the timed steps after warm-up.
"""
import argparse
import json
import statistics
import time

import torch
import torch.nn.functional as F


def timed(step, reps, warmup):
    for _ in range(warmup):
        step()
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        step()
        ts.append((time.perf_counter() - t0) * 1e3)
    return ts


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('--threads', type=int, default=2)
    ap.add_argument('--reps', type=int, default=20)
    ap.add_argument('--warmup', type=int, default=3)
    ap.add_argument('--n', type=int, default=1024)
    ap.add_argument('--c', type=int, default=50257)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    x = torch.randn(a.n, a.c, requires_grad=True)
    t = torch.randint(0, a.c, (a.n,))

    def fwd():
        with torch.no_grad():
            F.cross_entropy(x, t)

    def fwd_bwd():
        x.grad = None
        F.cross_entropy(x, t).backward()

    logits_bytes = a.n * a.c * 4
    for name, step, nbytes in (('cross-entropy-fwd', fwd, logits_bytes),
                               ('cross-entropy-fwd-bwd', fwd_bwd, 3 * logits_bytes)):
        ts = timed(step, a.reps, a.warmup)
        med = statistics.median(ts)
        print(json.dumps({'workload': name, 'impl': 'pytorch', 'threads': a.threads, 'n': a.n, 'c': a.c,
                          'median_ms': round(med, 3), 'min_ms': round(min(ts), 3), 'max_ms': round(max(ts), 3),
                          'bytes': nbytes, 'gbps': round(nbytes / (med * 1e-3) / 1e9, 2)}), flush=True)


if __name__ == '__main__':
    main()
