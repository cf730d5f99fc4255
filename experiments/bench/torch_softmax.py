#!/usr/bin/python3
"""PyTorch side of bench_softmax (the softmax-1024x50257 and log-softmax-1024x50257
workloads): F.softmax / F.log_softmax over the last dim of (1024, 50257) float32 logits,
forward and backward (y.backward(g) with a fixed g), timed as one step; median of --reps
runs after --warmup. Prints one JSON line per workload in the shape of the mumoe
benchmarks; compare.sh softmax runs both sides:

    /usr/bin/python3 torch_softmax.py [--threads 2] [--reps 10] [--warmup 3]
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
    p.add_argument('--reps', type=int, default=10)
    p.add_argument('--warmup', type=int, default=3)
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    rows, n = 1024, 50257
    x = torch.randn(rows, n, requires_grad=True)
    g = torch.randn(rows, n)
    nbytes = 5 * rows * n * 4  # x read and y written, then g and y read and dx written
    for name, fn in (('softmax-1024x50257', F.softmax), ('log-softmax-1024x50257', F.log_softmax)):
        def step():
            x.grad = None
            fn(x, -1).backward(g)

        ms = timed(step, a.reps, a.warmup)
        med = statistics.median(ms)
        print(json.dumps({'workload': name, 'impl': 'pytorch', 'threads': a.threads, 'median_ms': round(med, 3),
                          'min_ms': round(min(ms), 3), 'max_ms': round(max(ms), 3), 'bytes': nbytes,
                          'gbps': round(nbytes / (med * 1e-3) / 1e9, 2)}), flush=True)


if __name__ == '__main__':
    main()
