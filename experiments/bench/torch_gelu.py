#!/usr/bin/python3
"""PyTorch side of bench_gelu (the gelu-6272x512 workloads): F.gelu (approximate="none")
over (128 x 49, 512) float32, the forward alone without grad, then forward and backward
(y.backward(g) with a fixed g) as one step; median of --reps runs after --warmup. Prints
one JSON line per workload in the shape of the mumoe benchmarks; compare.sh gelu runs both:

    /usr/bin/python3 torch_gelu.py [--threads 2] [--reps 20] [--warmup 3]
"""
import argparse
import json
import statistics

import torch
import torch.nn.functional as F

from torch_cross_entropy import timed  # the same warm-up and timing loop, beside this file


def main():
    p = argparse.ArgumentParser()
    p.add_argument('--threads', type=int, default=2)
    p.add_argument('--reps', type=int, default=20)
    p.add_argument('--warmup', type=int, default=3)
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    rows, n = 128 * 49, 512
    x = torch.randn(rows, n, requires_grad=True)
    g = torch.randn(rows, n)
    tensor_bytes = rows * n * 4

    def forward():
        with torch.no_grad():
            F.gelu(x)

    def step():
        x.grad = None
        F.gelu(x).backward(g)

    for name, fn, nbytes in (('gelu-6272x512', forward, 2 * tensor_bytes),
                             ('gelu-6272x512-fwd-bwd', step, 5 * tensor_bytes)):
        ms = timed(fn, a.reps, a.warmup)
        med = statistics.median(ms)
        print(json.dumps({'workload': name, 'impl': 'pytorch', 'threads': a.threads, 'median_ms': round(med, 3),
                          'min_ms': round(min(ms), 3), 'max_ms': round(max(ms), 3), 'bytes': nbytes,
                          'gbps': round(nbytes / (med * 1e-3) / 1e9, 2)}), flush=True)


if __name__ == '__main__':
    main()
