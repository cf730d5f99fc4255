#!/usr/bin/python3
"""PyTorch side of bench_lm_head: the same workload, in the same JSON shape.

    /usr/bin/python3 experiments/bench/torch_lm_head.py [--threads 2] [--reps 5]

lm-head-loss: x (N, K) and W (V, K) float32 requiring grad, int64 targets; one step is
x.grad = W.grad = None, F.cross_entropy(F.linear(x, W), t).backward(). The median of the
timed steps after warm-up, and the process's peak resident memory above what it held
before the first step.
"""
import resource
import statistics

import torch
import torch.nn.functional as F

import torch_timing  # beside this file


def main():
    ap = torch_timing.parser(__doc__, reps=5, warmup=2)
    ap.add_argument('--n', type=int, default=1024)
    ap.add_argument('--k', type=int, default=256)
    ap.add_argument('--v', type=int, default=50257)
    a = ap.parse_args()
    torch_timing.start(a)
    x = torch.randn(a.n, a.k, requires_grad=True)
    w = (torch.randn(a.v, a.k) * 0.02).requires_grad_()
    t = torch.randint(0, a.v, (a.n,))

    def step():
        x.grad = None
        w.grad = None
        F.cross_entropy(F.linear(x, w), t).backward()

    before_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    ts = torch_timing.timed(step, a.reps, a.warmup)
    peak_mib = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before_kib) / 1024
    flops = 6.0 * a.n * a.k * a.v
    torch_timing.report('lm-head-loss', ts, a.threads, n=a.n, k=a.k, v=a.v,
                        gflops=round(flops / (statistics.median(ts) * 1e-3) / 1e9, 1),
                        rss_growth_mib=round(peak_mib, 1))


if __name__ == '__main__':
    main()
