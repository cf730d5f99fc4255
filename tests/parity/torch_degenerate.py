#!/usr/bin/python3
"""PyTorch side of tests/test_degenerate_parity.cpp: degenerate inputs (scalar-only
einsum, empty tensors, a batch whose every target is ignored). For each case it writes
one line to <dir>/torch.txt: name, the result's shape, then its values, then the
gradient of sum(result) with respect to the first input (its shape, then values), or
'-' when there is none. Inputs are fixed small values both sides build alike."""
import sys

import torch


def lin(shape, start=1.0):
    n = 1
    for s in shape:
        n *= s
    return (torch.arange(n, dtype=torch.float32) * 0.25 + start).reshape(shape)


def cases():
    yield 'einsum_scalars', [lin([]), lin([], 2.0)], lambda a, b: torch.einsum(',->', a, b)
    yield 'einsum_scalar_only', [lin([])], lambda a: torch.einsum('->', a)
    yield 'einsum_implicit_scalars', [lin([]), lin([], 2.0)], lambda a, b: torch.einsum(',', a, b)
    yield 'einsum_vector_scalar', [lin([3]), lin([], 2.0)], lambda a, b: torch.einsum('i,->i', a, b)
    yield 'einsum_empty', [lin([0, 3]), lin([3, 2])], lambda a, b: torch.einsum('ij,jk->ik', a, b)
    yield 'sum_empty', [lin([0, 3])], lambda a: a.sum()
    yield 'mean_empty', [lin([0, 3])], lambda a: a.mean()
    yield 'sum_dim0_empty', [lin([0, 3])], lambda a: a.sum(0)
    yield 'softmax_empty', [lin([0, 3])], lambda a: torch.softmax(a, 1)
    yield 'matmul_empty', [lin([0, 3]), lin([3, 2])], lambda a, b: a @ b
    yield 'matmul_k0', [lin([2, 0]), lin([0, 2])], lambda a, b: a @ b
    yield 'exp_empty', [lin([0, 3])], lambda a: a.exp()
    yield 'cumsum_empty', [lin([0, 3])], lambda a: a.cumsum(0)
    ignored = torch.tensor([-100, -100, -100])
    yield 'ce_all_ignored_mean', [lin([3, 4])], lambda a: torch.nn.functional.cross_entropy(a, ignored)
    yield 'ce_all_ignored_sum', [lin([3, 4])], lambda a: torch.nn.functional.cross_entropy(a, ignored, reduction='sum')
    yield 'ce_all_ignored_none', [lin([3, 4])], lambda a: torch.nn.functional.cross_entropy(a, ignored, reduction='none')
    empty_t = torch.zeros(0, dtype=torch.long)
    yield 'ce_empty_mean', [lin([0, 4])], lambda a: torch.nn.functional.cross_entropy(a, empty_t)
    yield 'ce_empty_sum', [lin([0, 4])], lambda a: torch.nn.functional.cross_entropy(a, empty_t, reduction='sum')


def fmt(t):
    t = t.detach().reshape(-1).tolist()
    return ' '.join(repr(float(v)) for v in t)


def shape(t):
    return 'x'.join(str(s) for s in t.shape) or 'scalar'


def main(d):
    with open(f'{d}/torch.txt', 'w') as f:
        for name, inputs, fn in cases():
            inputs = [t.clone().requires_grad_() for t in inputs]
            y = fn(*inputs)
            y.sum().backward()
            g = inputs[0].grad
            gpart = '-' if g is None else f'{shape(g)} | {fmt(g)}'
            f.write(f'{name} | {shape(y)} | {fmt(y)} | {gpart}\n')


if __name__ == '__main__':
    main(sys.argv[1])
