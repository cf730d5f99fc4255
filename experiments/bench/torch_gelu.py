#!/usr/bin/python3
"""PyTorch side of bench_gelu (the gelu-6272x512 workloads): F.gelu (approximate="none")
over (128 x 49, 512) float32, the forward alone without grad, then forward and backward
(y.backward(g) with a fixed g) as one step; median of --reps runs after --warmup. Prints
one JSON line per workload in the shape of the mumoe benchmarks; compare.sh gelu runs both:

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

    def forward():
        with torch.no_grad():
            F.gelu(x)

    def step():
        x.grad = None
        F.gelu(x).backward(g)

    for name, fn, nbytes in (('gelu-6272x512', forward, 2 * tensor_bytes),
                             ('gelu-6272x512-fwd-bwd', step, 5 * tensor_bytes)):
        torch_timing.report(name, torch_timing.timed(fn, a.reps, a.warmup), a.threads, nbytes)


if __name__ == '__main__':
    main()
