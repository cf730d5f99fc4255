#!/usr/bin/python3
"""PyTorch side of the layer parity tests (tests/test_layers_parity.cpp).

Reads <dir>/manifest.txt, one case per line:  NAME KIND KEY=VALUE... | ROLE=FILE:SHAPE...
(files are float32, row-major; SHAPE as 2x3x4). Kinds:

  layer_norm  normalized=3x4 eps=E        roles: x, w (upstream gradient), [weight, bias]
      writes NAME.out, NAME.grad_x, and NAME.grad_weight, NAME.grad_bias when affine.
  batch_norm  layout=bc|btc steps=S momentum=M eps=E   roles: x0, w0, ..., x<S-1>, w<S-1>,
              xe (an input for eval mode), [weight, bias]
      trains S steps, each writing NAME.out<s> and NAME.grad_x<s>; then writes
      NAME.running_mean, NAME.running_var, NAME.eval_out, and the gradients of weight and
      bias accumulated over the steps. layout btc is (B, T, C) input, normalised per
      channel over B and T: BatchNorm1d on its (B, C, T) transpose.
All outputs are <dir>/NAME.<what>.bin, float32.
"""
import sys

import torch

from layer_manifest import load, run_manifest, save


def layer_norm(d, name, args, files):
    shape = [int(s) for s in args['normalized'].split('x')]
    affine = 'weight' in files
    ln = torch.nn.LayerNorm(shape, eps=float(args['eps']), elementwise_affine=affine)
    if affine:
        with torch.no_grad():
            ln.weight.copy_(load(d, files['weight']))
            ln.bias.copy_(load(d, files['bias']))
    x = load(d, files['x'], grad=True)
    out = ln(x)
    (out * load(d, files['w'])).sum().backward()
    save(d, name, 'out', out)
    save(d, name, 'grad_x', x.grad)
    if affine:
        save(d, name, 'grad_weight', ln.weight.grad)
        save(d, name, 'grad_bias', ln.bias.grad)


def batch_norm(d, name, args, files):
    btc = args['layout'] == 'btc'
    affine = 'weight' in files
    channels = int(files['x0'].split(':')[1].split('x')[-1])
    bn = torch.nn.BatchNorm1d(channels, eps=float(args['eps']), momentum=float(args['momentum']), affine=affine)
    if affine:
        with torch.no_grad():
            bn.weight.copy_(load(d, files['weight']))
            bn.bias.copy_(load(d, files['bias']))
    # (B, T, C) -> (B, C, T), torch's layout for BatchNorm1d over a sequence, and back.
    run = (lambda x: bn(x.transpose(1, 2)).transpose(1, 2)) if btc else bn
    bn.train()
    for s in range(int(args['steps'])):
        x = load(d, files[f'x{s}'], grad=True)
        out = run(x)
        (out * load(d, files[f'w{s}'])).sum().backward()
        save(d, name, f'out{s}', out)
        save(d, name, f'grad_x{s}', x.grad)
    save(d, name, 'running_mean', bn.running_mean)
    save(d, name, 'running_var', bn.running_var)
    if affine:
        save(d, name, 'grad_weight', bn.weight.grad)
        save(d, name, 'grad_bias', bn.bias.grad)
    bn.eval()
    with torch.no_grad():
        save(d, name, 'eval_out', run(load(d, files['xe'])))


KINDS = {'layer_norm': layer_norm, 'batch_norm': batch_norm}


def main(d):
    run_manifest(d, KINDS)


if __name__ == '__main__':
    main(sys.argv[1])
