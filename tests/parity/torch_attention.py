#!/usr/bin/python3
"""PyTorch side of the attention parity test.

Reads <dir>/manifest.txt, one case per line:  NAME CAUSAL | Q K V W
where Q, K, V, W are FILE:float32:SHAPE (SHAPE as 2x3x4x5). For each case it computes, with
PyTorch's autograd in float32 (torch 1.13 has no F.scaled_dot_product_attention, so as
the reference GPT-2 block writes it),
    out = softmax(q k^T / sqrt(D) + mask) v,   mask = -inf above the diagonal when CAUSAL is 1,
then the gradients of sum(out * w), and writes <dir>/NAME.out.bin, NAME.dq.bin,
NAME.dk.bin and NAME.dv.bin (float32, row-major).
"""
import math
import sys

import numpy as np
import torch
import torch.nn.functional as F


def load(d, spec):
    name, dtype, shape = spec.split(':')
    assert dtype == 'float32', spec
    arr = np.fromfile(f'{d}/{name}', dtype=np.float32).reshape([int(s) for s in shape.split('x')])
    return torch.from_numpy(arr.copy())


def attention(q, k, v, causal):
    att = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
    if causal:
        t = q.shape[-2]
        att = att.masked_fill(torch.triu(torch.ones(t, t, dtype=torch.bool), 1), float('-inf'))
    return F.softmax(att, dim=-1) @ v


def main(d):
    for line in open(f'{d}/manifest.txt'):
        head, files = line.strip().split(' | ')
        name, causal = head.split()
        q, k, v, w = [load(d, s) for s in files.split()]
        for t in (q, k, v):
            t.requires_grad_(True)
        out = attention(q, k, v, causal == '1')
        (out * w).sum().backward()
        out.detach().numpy().astype(np.float32).tofile(f'{d}/{name}.out.bin')
        for t, suffix in ((q, 'dq'), (k, 'dk'), (v, 'dv')):
            t.grad.numpy().astype(np.float32).tofile(f'{d}/{name}.{suffix}.bin')


if __name__ == '__main__':
    main(sys.argv[1])
