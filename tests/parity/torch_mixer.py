#!/usr/bin/python3
"""PyTorch side of the MLP-Mixer parity test (tests/test_mixer_parity.cpp).

Reads from <dir>: config.txt (KEY VALUE lines: image, channels, patch, width, depth,
classes, token_block, channel_block (MLP, CPMuMoE or TRMuMoE), gate_norm (BatchNorm or
LayerNorm), input_norm (0 or 1), steps, lr, wd, ln_eps),
params.txt (NAME SHAPE lines; p.NAME.bin float32 each), images.bin (float32, B x C x S x S),
labels.bin (int64, B). Rebuilds the Mixer from those weights, written independently of
the library: the patch embedding as F.conv2d with stride p, token mixing on the
(B, D, T) transpose, μMoE blocks as batch-norm gating (no affine, batch statistics),
entmax-1.5 and two factorized layers sharing the coefficients. Writes, float32:
logits.bin, loss.bin, g.NAME.bin (gradients of the loss), and losses.bin, the losses of
`steps` AdamW steps (each taken before its step) from the same weights.
"""
import sys

import numpy as np
import torch
import torch.nn.functional as F

from torch_entmax import entmax15


def main(d):
    cfg = dict(line.split() for line in open(f'{d}/config.txt'))
    S, C, P = int(cfg['image']), int(cfg['channels']), int(cfg['patch'])
    D, classes = int(cfg['width']), int(cfg['classes'])
    eps = float(cfg['ln_eps'])
    params = {}
    for line in open(f'{d}/params.txt'):
        name, shape = line.split()
        arr = np.fromfile(f'{d}/p.{name}.bin', dtype=np.float32).reshape([int(s) for s in shape.split('x')])
        params[name] = torch.from_numpy(arr.copy()).requires_grad_()
    images = torch.from_numpy(np.fromfile(f'{d}/images.bin', dtype=np.float32).reshape(-1, C, S, S).copy())
    labels = torch.from_numpy(np.fromfile(f'{d}/labels.bin', dtype=np.int64).copy())
    p = params

    def mumoe_layer(z, a, pre, kind):
        # z (M, I), a (M, N); the bias row: 1 appended to z.
        z = torch.cat([z, torch.ones(z.shape[0], 1)], dim=1)
        if kind == 'CPMuMoE':
            return ((a @ p[pre + '.U1']) * (z @ p[pre + '.U_in'])) @ p[pre + '.U_out'].t()
        f1 = torch.einsum('mn,anc->mac', a, p[pre + '.U1'])
        f2 = torch.einsum('mi,cid->mcd', z, p[pre + '.U_in'])
        f = torch.bmm(f1, f2)                                   # (M, R1, R3)
        return torch.einsum('doa,mad->mo', p[pre + '.U_out'], f)

    def mixing(x, pre, kind):
        if kind == 'MLP':
            h = F.gelu(F.linear(x, p[pre + '.0.weight'], p[pre + '.0.bias']))
            return F.linear(h, p[pre + '.2.weight'], p[pre + '.2.bias'])
        lead, dim = x.shape[:-1], x.shape[-1]
        z = x.reshape(-1, dim)
        logits = z @ p[pre + '.G1']
        if cfg['gate_norm'] == 'BatchNorm':
            logits = F.batch_norm(logits, None, None, training=True, eps=1e-5)
        else:
            logits = F.layer_norm(logits, (logits.shape[-1],), eps=1e-5)
        a = entmax15(logits, dim=-1)
        if cfg['input_norm'] == '1':
            # The block's own LayerNorm on the layers' input (not on the gating's).
            z = F.layer_norm(z, (dim,), p[pre + '.input_norm.weight'], p[pre + '.input_norm.bias'], 1e-5)
        h = mumoe_layer(z, a, pre + '.layer1', kind)
        y = mumoe_layer(F.gelu(h), a, pre + '.layer2', kind)
        return y.reshape(*lead, -1)

    def ln(x, pre):
        return F.layer_norm(x, (D,), p[pre + '.weight'], p[pre + '.bias'], eps)

    def forward(img):
        w = p['embed.weight'].reshape(D, C, P, P)
        x = F.conv2d(img, w, p['embed.bias'], stride=P).flatten(2).transpose(1, 2)   # (B, T, D)
        for b in range(int(cfg['depth'])):
            pre = f'blocks.{b}'
            x = x + mixing(ln(x, pre + '.ln1').transpose(1, 2), pre + '.token_mix', cfg['token_block']).transpose(1, 2)
            x = x + mixing(ln(x, pre + '.ln2'), pre + '.channel_mix', cfg['channel_block'])
        return F.linear(ln(x, 'ln').mean(1), p['head.weight'], p['head.bias'])

    logits = forward(images)
    loss = F.cross_entropy(logits, labels)
    loss.backward()
    logits.detach().numpy().astype(np.float32).tofile(f'{d}/logits.bin')
    loss.detach().reshape(1).numpy().astype(np.float32).tofile(f'{d}/loss.bin')
    for name, t in params.items():
        t.grad.numpy().astype(np.float32).tofile(f'{d}/g.{name}.bin')
        t.grad = None

    opt = torch.optim.AdamW(list(params.values()), lr=float(cfg['lr']), weight_decay=float(cfg['wd']))
    losses = []
    for _ in range(int(cfg['steps'])):
        opt.zero_grad()
        loss = F.cross_entropy(forward(images), labels)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    np.array(losses, dtype=np.float32).tofile(f'{d}/losses.bin')


if __name__ == '__main__':
    torch.set_num_threads(2)
    main(sys.argv[1])
