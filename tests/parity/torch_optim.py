#!/usr/bin/python3
"""PyTorch side of the optimizer parity test (tests/test_optim_parity.cpp).

Reads <dir>/manifest.json: the step count, the parameters (shape, and the steps on which
a parameter has no gradient), and the configurations. Initial parameters are
<dir>/p<K>.bin and the gradients of every step <dir>/g<K>.bin ([steps, *shape]), all
float32 row-major. For each configuration it runs torch.optim.AdamW or SGD (foreach off,
as the C++ side computes per tensor), optionally clipping with clip_grad_norm_ and
setting each group's lr from the per-step list (scaled by the group's lr ratio), and
writes <dir>/<config>.p<K>.bin: the parameter after every step, [steps, *shape].
"""
import json
import sys

import numpy as np
import torch


def build(cfg, params):
    groups = [{'params': [params[k] for k in cfg['group0']]}]
    if cfg['group1']:
        g = {'params': [params[k] for k in cfg['group1']]}
        if cfg['group1_lr'] >= 0:
            g['lr'] = cfg['group1_lr']
        if cfg['group1_wd'] >= 0:
            g['weight_decay'] = cfg['group1_wd']
        groups.append(g)
    if cfg['optimizer'] == 'adamw':
        return torch.optim.AdamW(groups, lr=cfg['lr'], betas=tuple(cfg['betas']), eps=cfg['eps'],
                                 weight_decay=cfg['weight_decay'], amsgrad=cfg['amsgrad'],
                                 maximize=cfg['maximize'], foreach=False)
    return torch.optim.SGD(groups, lr=cfg['lr'], momentum=cfg['momentum'], dampening=cfg['dampening'],
                           weight_decay=cfg['weight_decay'], nesterov=cfg['nesterov'], foreach=False)


def main(d):
    man = json.load(open(f'{d}/manifest.json'))
    steps = man['steps']
    init, grads = [], []
    for k, p in enumerate(man['params']):
        shape = p['shape']
        init.append(np.fromfile(f'{d}/p{k}.bin', dtype=np.float32).reshape(shape))
        grads.append(np.fromfile(f'{d}/g{k}.bin', dtype=np.float32).reshape([steps] + shape))
    for cfg in man['configs']:
        params = [torch.tensor(a.copy(), requires_grad=True) for a in init]
        opt = build(cfg, params)
        # The lr each group was created with: schedules scale from it, keeping the ratios.
        initial = [g['lr'] for g in opt.param_groups]
        history = [[] for _ in params]
        for s in range(steps):
            for k, p in enumerate(params):
                p.grad = None if s in man['params'][k]['skip'] else torch.tensor(grads[k][s].copy())
            if cfg['clip'] > 0:
                torch.nn.utils.clip_grad_norm_(params, cfg['clip'])
            if cfg['lrs'] is not None:
                for g, lr0 in zip(opt.param_groups, initial):
                    g['lr'] = cfg['lrs'][s] * (lr0 / cfg['lr'])
            opt.step()
            for k, p in enumerate(params):
                history[k].append(p.detach().numpy().copy())
        for k, h in enumerate(history):
            np.stack(h).astype(np.float32).tofile(f"{d}/{cfg['name']}.p{k}.bin")


if __name__ == '__main__':
    main(sys.argv[1])
