#!/usr/bin/python3
"""PyTorch side of bench_cross_entropy: the same workloads, in the same JSON shape.

    /usr/bin/python3 experiments/bench/torch_cross_entropy.py [--threads 2] [--reps 20]

cross-entropy-fwd: F.cross_entropy(x, t) under no_grad; cross-entropy-fwd-bwd: one step,
x.grad = None then F.cross_entropy(x, t).backward(), with x (N, C) float32 requiring
grad, t int64 targets, mean reduction. The median of the timed steps after warm-up.
"""
import torch
import torch.nn.functional as F

import torch_timing  # beside this file


def main():
    ap = torch_timing.parser(__doc__, reps=20)
    ap.add_argument('--n', type=int, default=1024)
    ap.add_argument('--c', type=int, default=50257)
    a = ap.parse_args()
    torch_timing.start(a)
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
        torch_timing.report(name, torch_timing.timed(step, a.reps, a.warmup), a.threads, nbytes, n=a.n, c=a.c)


if __name__ == '__main__':
    main()
