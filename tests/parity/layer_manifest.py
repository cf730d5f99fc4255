"""The exchange format shared by torch_layers.py and torch_norm.py.

<dir>/manifest.txt holds one case per line:  NAME KIND KEY=VALUE ... | ROLE=FILE:SHAPE ...
where FILE is a float32 raw file in <dir> and SHAPE is like 2x3x4. Outputs are written as
<dir>/NAME.<what>.bin, float32.
"""
import numpy as np
import torch


def load(d, spec, grad=False):
    name, shape = spec.split(':')
    arr = np.fromfile(f'{d}/{name}', dtype=np.float32).reshape([int(s) for s in shape.split('x')])
    return torch.from_numpy(arr.copy()).requires_grad_(grad)


def save(d, name, what, t):
    t.detach().numpy().astype(np.float32).tofile(f'{d}/{name}.{what}.bin')


def run_manifest(d, kinds):
    """Calls kinds[KIND](d, NAME, {KEY: VALUE}, {ROLE: FILE:SHAPE}) for every line."""
    for line in open(f'{d}/manifest.txt'):
        head, tail = line.strip().split(' | ')
        name, kind, *args = head.split()
        args = dict(a.split('=', 1) for a in args)
        files = dict(f.split('=', 1) for f in tail.split())
        kinds[kind](d, name, args, files)
