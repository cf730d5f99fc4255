#!/usr/bin/python3
"""PyTorch side of bench_layer_norm (the layer-norm-1024x768 workload): F.layer_norm over
the last dim of a (1024, 768) float32 x with weight and bias, forward and backward
(y.backward(g) with a fixed g), timed as one step; median of --reps runs after --warmup.
Prints one JSON line in the shape of the mumoe benchmarks. Its command line follows
../shared/reference/torch_reference.py, so that compare.sh calls both alike:

    /usr/bin/python3 torch_layer_norm.py bench [--workload layer-norm-1024x768] [--threads 2] [--reps 50]
"""
import argparse
import json
import statistics
import time

import torch
import torch.nn.functional as F


def main():
    p = argparse.ArgumentParser()
    p.add_argument('mode', nargs='?', default='bench', choices=['bench'])
    p.add_argument('--workload', default='layer-norm-1024x768', choices=['layer-norm-1024x768'])
    p.add_argument('--threads', type=int, default=2)
    p.add_argument('--reps', type=int, default=50)
    p.add_argument('--warmup', type=int, default=10)
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    rows, n = 1024, 768
    x = torch.randn(rows, n, requires_grad=True)
    w = (torch.randn(n) + 1).requires_grad_()
    b = torch.randn(n, requires_grad=True)
    g = torch.randn(rows, n)

    def step():
        x.grad = w.grad = b.grad = None
        F.layer_norm(x, (n,), w, b, 1e-5).backward(g)

    for _ in range(a.warmup):
        step()
    ms = []
    for _ in range(a.reps):
        t0 = time.perf_counter()
        step()
        ms.append((time.perf_counter() - t0) * 1e3)
    nbytes = 5 * rows * n * 4  # x read and y written, then g and x read and dx written
    med = statistics.median(ms)
    print(json.dumps({'workload': a.workload, 'impl': 'pytorch', 'threads': a.threads, 'median_ms': round(med, 3),
                      'min_ms': round(min(ms), 3), 'max_ms': round(max(ms), 3), 'bytes': nbytes,
                      'gbps': round(nbytes / (med * 1e-3) / 1e9, 2)}))


if __name__ == '__main__':
    main()
