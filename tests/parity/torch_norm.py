#!/usr/bin/python3
"""PyTorch side of the functional normalisation parity test (tests/test_norm_parity.cpp).

Reads <dir>/manifest.txt, one case per line:  NAME KIND KEY=VALUE... | ROLE=FILE:SHAPE...
(files are float32, row-major; SHAPE as 2x3x4). Kinds:

  layer_norm  normalized=3x4 eps=E        roles: x, g (upstream gradient), [weight], [bias]
      F.layer_norm; writes NAME.out, NAME.grad_x, and NAME.grad_weight / NAME.grad_bias
      for the parameters given.
  batch_norm  layout=first|last steps=S momentum=M eps=E
              roles: x0, g0, ..., x<S-1>, g<S-1>, xe, ge (eval input and gradient),
              [weight, bias]
      F.batch_norm with running statistics (C) starting at zeros and ones: S training
      steps, each writing NAME.out<s> and NAME.grad_x<s>; then NAME.running_mean,
      NAME.running_var, NAME.grad_weight and NAME.grad_bias (summed over the steps); then
      one eval step writing NAME.eval_out, NAME.eval_grad_x, NAME.eval_grad_weight and
      NAME.eval_grad_bias. layout last is channels-last (N, ..., C): F.batch_norm on the
      input with its last dim moved to dim 1, and the output moved back.
All outputs are <dir>/NAME.<what>.bin, float32.
"""
import sys

import torch
import torch.nn.functional as F

from layer_manifest import load, run_manifest, save


def layer_norm(d, name, args, files):
    shape = [int(s) for s in args['normalized'].split('x')]
    weight = load(d, files['weight'], grad=True) if 'weight' in files else None
    bias = load(d, files['bias'], grad=True) if 'bias' in files else None
    x = load(d, files['x'], grad=True)
    out = F.layer_norm(x, shape, weight, bias, float(args['eps']))
    out.backward(load(d, files['g']))
    save(d, name, 'out', out)
    save(d, name, 'grad_x', x.grad)
    if weight is not None:
        save(d, name, 'grad_weight', weight.grad)
    if bias is not None:
        save(d, name, 'grad_bias', bias.grad)


def batch_norm(d, name, args, files):
    last = args['layout'] == 'last'
    affine = 'weight' in files
    weight = load(d, files['weight'], grad=True) if affine else None
    bias = load(d, files['bias'], grad=True) if affine else None
    channels = weight.numel() if affine else int(args['channels'])
    running_mean, running_var = torch.zeros(channels), torch.ones(channels)
    momentum, eps = float(args['momentum']), float(args['eps'])

    def run(x, training):
        xin = x.movedim(-1, 1) if last else x
        out = F.batch_norm(xin, running_mean, running_var, weight, bias, training, momentum, eps)
        return out.movedim(1, -1) if last else out

    for s in range(int(args['steps'])):
        x = load(d, files[f'x{s}'], grad=True)
        out = run(x, True)
        out.backward(load(d, files[f'g{s}']))
        save(d, name, f'out{s}', out)
        save(d, name, f'grad_x{s}', x.grad)
    save(d, name, 'running_mean', running_mean)
    save(d, name, 'running_var', running_var)
    if affine:
        save(d, name, 'grad_weight', weight.grad)
        save(d, name, 'grad_bias', bias.grad)
        weight.grad, bias.grad = None, None
    x = load(d, files['xe'], grad=True)
    out = run(x, False)
    out.backward(load(d, files['ge']))
    save(d, name, 'eval_out', out)
    save(d, name, 'eval_grad_x', x.grad)
    if affine:
        save(d, name, 'eval_grad_weight', weight.grad)
        save(d, name, 'eval_grad_bias', bias.grad)


KINDS = {'layer_norm': layer_norm, 'batch_norm': batch_norm}


def main(d):
    torch.set_num_threads(2)
    run_manifest(d, KINDS)


if __name__ == '__main__':
    main(sys.argv[1])
