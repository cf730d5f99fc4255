#!/usr/bin/python3
"""PyTorch side of bench_softmax (the softmax-1024x50257 and log-softmax-1024x50257
workloads): F.softmax / F.log_softmax over the last dim of (1024, 50257) float32 logits,
forward and backward (y.backward(g) with a fixed g), timed as one step; median of --reps
runs after --warmup. Prints one JSON line per workload in the shape of the mumoe
benchmarks; compare.sh softmax runs both sides:

    /usr/bin/python3 torch_softmax.py [--threads 2] [--reps 10] [--warmup 3]
"""
import torch
import torch.nn.functional as F

import torch_timing  # beside this file


def main():
    a = torch_timing.parser(__doc__, reps=10).parse_args()
    torch_timing.start(a)
    rows, n = 1024, 50257
    x = torch.randn(rows, n, requires_grad=True)
    g = torch.randn(rows, n)
    nbytes = 5 * rows * n * 4  # x read and y written, then g and y read and dx written
    for name, fn in (('softmax-1024x50257', F.softmax), ('log-softmax-1024x50257', F.log_softmax)):
        def step():
            x.grad = None
            fn(x, -1).backward(g)

        torch_timing.report(name, torch_timing.timed(step, a.reps, a.warmup), a.threads, nbytes)


if __name__ == '__main__':
    main()
