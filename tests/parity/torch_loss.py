#!/usr/bin/python3
"""PyTorch side of the loss parity tests (tests/test_loss_parity.cpp).

Reads <dir>/manifest.txt, one case per line:
    NAME OP KEY=VALUE... | FILE:DTYPE:SHAPE:ROLE:GRAD ...
OP is a torch.nn.functional loss; KEY=VALUE are its keyword options (reduction,
ignore_index, label_smoothing); ROLE names the argument the file holds (input, target,
weight, pos_weight; "upstream" is the gradient v of the output); GRAD is 1 for the
arguments whose gradient is compared. For each case it computes out = OP(...), then
d(sum(out * v)) for those arguments, and writes <dir>/NAME.out.bin and
<dir>/NAME.grad<K>.bin (float32, row-major; K counts the compared arguments in order).
"""
import sys

import numpy as np
import torch
import torch.nn.functional as F

OPS = {
    'cross_entropy': F.cross_entropy,
    'nll_loss': F.nll_loss,
    'mse_loss': F.mse_loss,
    'binary_cross_entropy_with_logits': F.binary_cross_entropy_with_logits,
}
DTYPES = {'float32': (np.float32, torch.float32), 'int64': (np.int64, torch.int64)}
OPTION_TYPES = {'reduction': str, 'ignore_index': int, 'label_smoothing': float}


def load(d, spec):
    name, dtype, shape, role, grad = spec.split(':')
    shape = [] if shape == 'scalar' else [int(s) for s in shape.split('x')]
    arr = np.fromfile(f'{d}/{name}', dtype=DTYPES[dtype][0]).reshape(shape)
    t = torch.from_numpy(arr.copy())
    if grad == '1':
        t.requires_grad_(True)
    return role, t


def main(d):
    for line in open(f'{d}/manifest.txt'):
        head, files = line.strip().split(' | ')
        name, op, *options = head.split()
        kwargs = {}
        for o in options:
            key, value = o.split('=')
            kwargs[key] = OPTION_TYPES[key](value)
        args = [load(d, s) for s in files.split()]
        tensors = {role: t for role, t in args}
        v = tensors.pop('upstream')
        out = OPS[op](**tensors, **kwargs)
        (out * v).sum().backward()
        out.detach().numpy().astype(np.float32).tofile(f'{d}/{name}.out.bin')
        k = 0
        for role, t in args:
            if t.requires_grad:
                t.grad.numpy().astype(np.float32).tofile(f'{d}/{name}.grad{k}.bin')
                k += 1


if __name__ == '__main__':
    main(sys.argv[1])
