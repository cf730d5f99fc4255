#!/usr/bin/python3
"""PyTorch side of the type promotion parity test.

Usage: torch_type_promotion.py DIR

Writes DIR/result_types.txt, one line per case:
    KIND_A DTYPE_A KIND_B DTYPE_B RESULT
KIND is "dim" (a tensor of shape [6]), "zero" (a 0-dim tensor) or "number" (a Python
bool, int or float: DTYPE then reads bool, int or float); RESULT is torch.result_type's
dtype. And DIR/values.txt, one line per (dtype pair, op) for shape-[6] operands
    DTYPE_A DTYPE_B OP RESULT_DTYPE v0 v1 ... v5
with OP in add, sub, mul, div, lt, maximum and the values printed as float64 (repr).
The operands are A = [1, 2, 3, 0, 5, 7] and B = [2, 1, 3, 4, 0, 1] converted to each dtype.
"""
import sys

import torch

DTYPES = {'float32': torch.float32, 'float64': torch.float64, 'int64': torch.int64, 'bool': torch.bool,
          'bfloat16': torch.bfloat16, 'float16': torch.float16, 'int8': torch.int8, 'int16': torch.int16,
          'int32': torch.int32, 'uint8': torch.uint8}
NAME = {v: k for k, v in DTYPES.items()}
NUMBERS = {'bool': True, 'int': 2, 'float': 2.5}


def operand(kind, dtype):
    if kind == 'number':
        return NUMBERS[dtype]
    shape = (6,) if kind == 'dim' else ()
    return torch.ones(shape, dtype=DTYPES[dtype])


def main(d):
    with open(f'{d}/result_types.txt', 'w') as f:
        for ka in ('dim', 'zero'):
            for da in DTYPES:
                for kb in ('dim', 'zero', 'number'):
                    for db in (NUMBERS if kb == 'number' else DTYPES):
                        r = torch.result_type(operand(ka, da), operand(kb, db))
                        f.write(f'{ka} {da} {kb} {db} {NAME[r]}\n')
    a0, b0 = torch.tensor([1, 2, 3, 0, 5, 7]), torch.tensor([2, 1, 3, 4, 0, 1])
    ops = {'add': torch.add, 'sub': torch.sub, 'mul': torch.mul, 'div': torch.div, 'lt': torch.lt,
           'maximum': torch.maximum}
    with open(f'{d}/values.txt', 'w') as f:
        for da in DTYPES:
            for db in DTYPES:
                a, b = a0.to(DTYPES[da]), b0.to(DTYPES[db])
                for name, op in ops.items():
                    if name == 'sub' and torch.bool in (a.dtype, b.dtype):
                        continue  # torch refuses subtraction with bool operands
                    y = op(a, b)
                    vals = ' '.join(repr(float(v)) for v in y.double().tolist())
                    f.write(f'{da} {db} {name} {NAME[y.dtype]} {vals}\n')


if __name__ == '__main__':
    main(sys.argv[1])
