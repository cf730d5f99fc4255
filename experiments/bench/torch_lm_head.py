#!/usr/bin/python3
"""PyTorch side of bench_lm_head: the same workload, in the same JSON shape.

    /usr/bin/python3 experiments/bench/torch_lm_head.py [--threads 2] [--reps 5]

lm-head-loss: x (N, K) and W (V, K) float32 requiring grad, int64 targets; one step is
x.grad = W.grad = None, F.cross_entropy(F.linear(x, W), t).backward(). The median of the
timed steps after warm-up, and the process's peak resident memory above what it held
before the first step.
"""
import argparse
import json
import resource
import statistics

import torch
import torch.nn.functional as F

from torch_cross_entropy import timed  # the same warm-up and timing loop, beside this file


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('--threads', type=int, default=2)
    ap.add_argument('--reps', type=int, default=5)
    ap.add_argument('--warmup', type=int, default=2)
    ap.add_argument('--n', type=int, default=1024)
    ap.add_argument('--k', type=int, default=256)
    ap.add_argument('--v', type=int, default=50257)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    x = torch.randn(a.n, a.k, requires_grad=True)
    w = (torch.randn(a.v, a.k) * 0.02).requires_grad_()
    t = torch.randint(0, a.v, (a.n,))

    def step():
        x.grad = None
        w.grad = None
        F.cross_entropy(F.linear(x, w), t).backward()

    before_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    ts = timed(step, a.reps, a.warmup)
    med = statistics.median(ts)
    peak_mib = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before_kib) / 1024
    flops = 6.0 * a.n * a.k * a.v
    print(json.dumps({'workload': 'lm-head-loss', 'impl': 'pytorch', 'threads': a.threads, 'n': a.n, 'k': a.k,
                      'v': a.v, 'median_ms': round(med, 3), 'min_ms': round(min(ts), 3), 'max_ms': round(max(ts), 3),
                      'gflops': round(flops / (med * 1e-3) / 1e9, 1), 'rss_growth_mib': round(peak_mib, 1)}), flush=True)


if __name__ == '__main__':
    main()
