#!/usr/bin/python3
"""PyTorch side of the entmax parity test.

Reads <dir>/manifest.txt, one case per line:  NAME DIM | X W
where X and W are FILE:float32:SHAPE (SHAPE as 2x3x4). For each case it computes
out = entmax15(x, DIM) with PyTorch's autograd through the benchmark reference's
definition, then d(sum(out * w))/dx, and writes <dir>/NAME.out.bin and
<dir>/NAME.grad0.bin (float32, row-major).
"""
import sys

import numpy as np
import torch


# The benchmark reference's entmax15 (shared/reference/torch_reference.py), unchanged:
# the library's entmax15 must agree with it in value and gradient.
def entmax15(x, dim=-1):
    x = x / 2
    x = x - x.max(dim=dim, keepdim=True).values
    xs, _ = torch.sort(x, dim=dim, descending=True)
    d = x.shape[dim]
    rho = torch.arange(1, d + 1, device=x.device, dtype=x.dtype)
    shape = [1] * x.dim(); shape[dim] = d
    rho = rho.view(shape)
    mean = xs.cumsum(dim) / rho
    mean_sq = (xs ** 2).cumsum(dim) / rho
    ss = rho * (mean_sq - mean ** 2)
    delta = (1 - ss) / rho
    delta_nz = torch.clamp(delta, 0)
    tau = mean - torch.sqrt(delta_nz)
    support = (tau <= xs).sum(dim=dim, keepdim=True)
    tau_star = tau.gather(dim, support - 1)
    return torch.clamp(x - tau_star, min=0) ** 2


def load(d, spec):
    name, dtype, shape = spec.split(':')
    assert dtype == 'float32', spec
    arr = np.fromfile(f'{d}/{name}', dtype=np.float32).reshape([int(s) for s in shape.split('x')])
    return torch.from_numpy(arr.copy())


def main(d):
    for line in open(f'{d}/manifest.txt'):
        head, files = line.strip().split(' | ')
        name, dim = head.split()
        x, w = [load(d, s) for s in files.split()]
        x.requires_grad_(True)
        out = entmax15(x, int(dim))
        (out * w).sum().backward()
        out.detach().numpy().astype(np.float32).tofile(f'{d}/{name}.out.bin')
        x.grad.numpy().astype(np.float32).tofile(f'{d}/{name}.grad0.bin')


if __name__ == '__main__':
    main(sys.argv[1])
