#!/usr/bin/python3
"""PyTorch side of the parity tests.

Reads <dir>/manifest.txt, one case per line:  NAME OP ARGS... | INPUT...
where each INPUT is FILE:DTYPE:SHAPE (SHAPE as 2x3x4, or "scalar"), the first input
files being the op's operands and the last one the upstream gradient w. For each case it
computes out = OP(inputs), then d(sum(out * w))/d(input) for every float input, and writes
<dir>/NAME.out.bin and <dir>/NAME.grad<K>.bin (float32, row-major).
"""
import sys

import numpy as np
import torch
import torch.nn.functional as F

OPS = {
    'matmul': lambda a, b: a @ b,
    'softmax': lambda x, dim: F.softmax(x, dim=int(dim)),
    'log_softmax': lambda x, dim: F.log_softmax(x, dim=int(dim)),
    'cross_entropy': lambda x, t, reduction, ignore: F.cross_entropy(x, t, reduction=reduction, ignore_index=int(ignore)),
    'gelu': lambda x, approx: F.gelu(x, approximate=approx),
    'var': lambda x, dims, correction, keep: torch.var(x, dim=[int(d) for d in dims.split(',')],
                                                      unbiased=bool(int(correction)), keepdim=bool(int(keep))),
    'cumsum': lambda x, dim: torch.cumsum(x, dim=int(dim)),
    'gather': lambda x, dim, idx: torch.gather(x, int(dim), idx),
}
DTYPES = {'float32': (np.float32, torch.float32), 'int64': (np.int64, torch.int64)}


def load(d, spec):
    name, dtype, shape = spec.split(':')
    shape = [] if shape == 'scalar' else [int(s) for s in shape.split('x')]
    arr = np.fromfile(f'{d}/{name}', dtype=DTYPES[dtype][0]).reshape(shape)
    t = torch.from_numpy(arr.copy())
    if dtype == 'float32':
        t.requires_grad_(True)
    return t


def main(d):
    for line in open(f'{d}/manifest.txt'):
        head, files = line.strip().split(' | ')
        name, op, *args = head.split()
        tensors = [load(d, s) for s in files.split()]
        *inputs, w = tensors
        if op == 'gather':  # operands: x, index; args: dim
            out = OPS[op](inputs[0], args[0], inputs[1])
        elif op == 'cross_entropy':
            out = OPS[op](inputs[0], inputs[1], *args)
        else:
            out = OPS[op](*inputs, *args)
        (out * w.detach()).sum().backward()
        out.detach().numpy().astype(np.float32).tofile(f'{d}/{name}.out.bin')
        k = 0
        for t in inputs:
            if t.dtype == torch.float32:
                t.grad.numpy().astype(np.float32).tofile(f'{d}/{name}.grad{k}.bin')
                k += 1


if __name__ == '__main__':
    main(sys.argv[1])
