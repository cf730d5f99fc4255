#!/usr/bin/python3
"""PyTorch side of bench_layer_norm (the layer-norm-1024x768 workload): F.layer_norm over
the last dim of a (1024, 768) float32 x with weight and bias, forward and backward
(y.backward(g) with a fixed g), timed as one step; median of --reps runs after --warmup.
Prints one JSON line in the shape of the mumoe benchmarks. Its command line follows
../shared/reference/torch_reference.py, so that compare.sh calls both alike:

    /usr/bin/python3 torch_layer_norm.py bench [--workload layer-norm-1024x768] [--threads 2] [--reps 50]
"""
import torch
import torch.nn.functional as F

import torch_timing  # beside this file


def main():
    p = torch_timing.parser(__doc__, reps=50, warmup=10)
    p.add_argument('mode', nargs='?', default='bench', choices=['bench'])
    p.add_argument('--workload', default='layer-norm-1024x768', choices=['layer-norm-1024x768'])
    a = p.parse_args()
    torch_timing.start(a)
    rows, n = 1024, 768
    x = torch.randn(rows, n, requires_grad=True)
    w = (torch.randn(n) + 1).requires_grad_()
    b = torch.randn(n, requires_grad=True)
    g = torch.randn(rows, n)

    def step():
        x.grad = w.grad = b.grad = None
        F.layer_norm(x, (n,), w, b, 1e-5).backward(g)

    nbytes = 5 * rows * n * 4  # x read and y written, then g and x read and dx written
    torch_timing.report(a.workload, torch_timing.timed(step, a.reps, a.warmup), a.threads, nbytes)


if __name__ == '__main__':
    main()
