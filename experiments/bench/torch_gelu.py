#!/usr/bin/python3
"""PyTorch side of bench_gelu (the gelu-6272x512 and gelu-tanh-6272x512 workloads): F.gelu
with approximate="none", then "tanh", over (128 x 49, 512) float32, the forward alone
without grad, then forward and backward (y.backward(g) with a fixed g) as one step; median
of --reps runs after --warmup. Prints one JSON line per workload in the shape of the mumoe
benchmarks; compare.sh gelu runs both:

    /usr/bin/python3 torch_gelu.py [--threads 2] [--reps 20] [--warmup 3]
"""
import torch
import torch.nn.functional as F

import torch_timing  # beside this file


def main():
    a = torch_timing.parser(__doc__, reps=20).parse_args()
    torch_timing.start(a)
    rows, n = 128 * 49, 512
    x = torch.randn(rows, n, requires_grad=True)
    g = torch.randn(rows, n)
    tensor_bytes = rows * n * 4

    for approximate, name in (('none', 'gelu-6272x512'), ('tanh', 'gelu-tanh-6272x512')):
        def forward():
            with torch.no_grad():
                F.gelu(x, approximate=approximate)

        def step():
            x.grad = None
            F.gelu(x, approximate=approximate).backward(g)

        for workload, fn, nbytes in ((name, forward, 2 * tensor_bytes), (name + '-fwd-bwd', step, 5 * tensor_bytes)):
            torch_timing.report(workload, torch_timing.timed(fn, a.reps, a.warmup), a.threads, nbytes)


if __name__ == '__main__':
    main()
