#!/usr/bin/python3
"""PyTorch side of the GPT-2 parity test (tests/test_gpt2_parity.cpp).

Usage: torch_gpt2.py DIR

DIR/manifest.txt holds one case per line:  NAME MODE KEY=VALUE ...
with keys n_layer, n_head, n_embd, block_size, vocab, bias (0/1), mlp (dense, cp, tr),
experts, rank, steps, lr, wd.

MODE train: DIR/NAME.weights.safetensors holds mumoe's state dict (nanoGPT names) and
  DIR/NAME.inputs.safetensors the batches idx, targets (steps, B, T) int64. The model is
  rebuilt here from those weights (GPT-2 as nanoGPT writes it; the μMoE MLP block as
  torch_reference.py's MuMoEBlock, with mumoe's tensor names), and DIR/NAME.torch.safetensors
  receives: logits and loss on batch 0, grad.<name> for every parameter, and losses (steps,)
  of `steps` AdamW steps (nanoGPT's decay split: dim >= 2 decays; betas (0.9, 0.95)), each
  loss taken before its step on batch s.
MODE hf: a random GPT-2 is built here in the Hugging Face GPT2Model layout (Conv1D weights
  stored (in, out), the attn.bias / attn.masked_bias buffers) and saved, without a prefix, to
  DIR/NAME.model.safetensors; its logits on DIR/NAME.inputs.safetensors's idx (B, T) go to
  DIR/NAME.torch.safetensors.
The safetensors files are read and written with struct and json (no safetensors package).
"""
import json
import math
import struct
import sys

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from torch_entmax import entmax15

NUMPY = {'F32': np.float32, 'F64': np.float64, 'I64': np.int64}
CODE = {torch.float32: 'F32', torch.float64: 'F64', torch.int64: 'I64'}


def read_safetensors(path):
    blob = open(path, 'rb').read()
    (n,) = struct.unpack('<Q', blob[:8])
    header = json.loads(blob[8:8 + n].decode('utf-8'))
    header.pop('__metadata__', None)
    data = blob[8 + n:]
    out = {}
    for name, e in header.items():
        begin, end = e['data_offsets']
        arr = np.frombuffer(data[begin:end], dtype=NUMPY[e['dtype']]).reshape(e['shape'])
        out[name] = torch.from_numpy(arr.copy())
    return out


def write_safetensors(path, tensors):
    header, blobs, pos = {}, [], 0
    for name, t in tensors.items():
        b = t.detach().contiguous().numpy().tobytes()
        header[name] = {'dtype': CODE[t.dtype], 'shape': list(t.shape), 'data_offsets': [pos, pos + len(b)]}
        blobs.append(b)
        pos += len(b)
    text = json.dumps(header).encode('utf-8')
    text += b' ' * ((8 - len(text) % 8) % 8)
    with open(path, 'wb') as f:
        f.write(struct.pack('<Q', len(text)))
        f.write(text)
        for b in blobs:
            f.write(b)


# ---------------------------------------------------------------- nanoGPT's GPT-2
class LayerNorm(nn.Module):
    """nanoGPT's LayerNorm: the bias is optional."""
    def __init__(self, n, bias):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(n))
        self.bias = nn.Parameter(torch.zeros(n)) if bias else None

    def forward(self, x):
        return F.layer_norm(x, self.weight.shape, self.weight, self.bias, 1e-5)


def causal_attention(q, k, v):
    T = q.size(-2)
    att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
    att = att.masked_fill(torch.triu(torch.ones(T, T, dtype=torch.bool), 1), float('-inf'))
    return F.softmax(att, dim=-1) @ v


class CausalSelfAttention(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.n_head = c['n_head']
        self.c_attn = nn.Linear(c['n_embd'], 3 * c['n_embd'], bias=c['bias'])
        self.c_proj = nn.Linear(c['n_embd'], c['n_embd'], bias=c['bias'])

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(C, dim=2)
        q, k, v = [t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v)]
        y = causal_attention(q, k, v).transpose(1, 2).contiguous().view(B, T, C)
        return self.c_proj(y)


class MLP(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c_fc = nn.Linear(c['n_embd'], 4 * c['n_embd'], bias=c['bias'])
        self.c_proj = nn.Linear(4 * c['n_embd'], c['n_embd'], bias=c['bias'])

    def forward(self, x):
        return self.c_proj(F.gelu(self.c_fc(x), approximate='tanh'))


# ---------------------------------------------------------------- the μMoE block (torch_reference.py's)
def with_one(z, bias):
    return torch.cat([z, torch.ones(*z.shape[:-1], 1, dtype=z.dtype)], dim=-1) if bias else z


class CPLayer(nn.Module):
    """y = U_out ((U1^T a) * (U_in^T [z; 1])): U1 (N, R), U_in (I+1, R), U_out (O, R)."""
    def __init__(self, i, o, n, r, bias):
        super().__init__()
        self.bias = bias
        self.U1 = nn.Parameter(torch.empty(n, r))
        self.U_in = nn.Parameter(torch.empty(i + int(bias), r))
        self.U_out = nn.Parameter(torch.empty(o, r))

    def forward(self, z, a):
        return ((a @ self.U1) * (with_one(z, self.bias) @ self.U_in)) @ self.U_out.t()


class TRLayer(nn.Module):
    """Tensor ring: U1 (R1, N, R2), U_in (R2, I+1, R3), U_out (R3, O, R1)."""
    def __init__(self, i, o, n, r1, r2, r3, bias):
        super().__init__()
        self.bias = bias
        self.U1 = nn.Parameter(torch.empty(r1, n, r2))
        self.U_in = nn.Parameter(torch.empty(r2, i + int(bias), r3))
        self.U_out = nn.Parameter(torch.empty(r3, o, r1))

    def forward(self, z, a):
        f1 = torch.einsum('btn,anc->btac', a, self.U1)
        f2 = torch.einsum('bti,cid->btcd', with_one(z, self.bias), self.U_in)
        return torch.einsum('doa,btad->bto', self.U_out, torch.einsum('btac,btcd->btad', f1, f2))


class MuMoEBlock(nn.Module):
    """a = entmax15(LN(x G1)); y = layer2(GELU(layer1(input_norm(x), a)), a)."""
    def __init__(self, c):
        super().__init__()
        d, n, r, b = c['n_embd'], c['experts'], c['rank'], c['bias']
        self.G1 = nn.Parameter(torch.zeros(d, n))
        self.input_norm = nn.LayerNorm(d)
        if c['mlp'] == 'cp':
            self.layer1, self.layer2 = CPLayer(d, 4 * d, n, r, b), CPLayer(4 * d, d, n, r, b)
        else:
            self.layer1, self.layer2 = TRLayer(d, 4 * d, n, 4, 4, r, b), TRLayer(4 * d, d, n, 4, 4, r, b)

    def forward(self, x):
        a = entmax15(F.layer_norm(x @ self.G1, (self.G1.shape[1],), eps=1e-5))
        return self.layer2(F.gelu(self.layer1(self.input_norm(x), a)), a)


class Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.ln_1 = LayerNorm(c['n_embd'], c['bias'])
        self.attn = CausalSelfAttention(c)
        self.dense = c['mlp'] == 'dense'
        if self.dense:
            self.ln_2 = LayerNorm(c['n_embd'], c['bias'])
            self.mlp = MLP(c)
        else:
            self.mlp = MuMoEBlock(c)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x) if self.dense else x)


class GPT(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(c['vocab'], c['n_embd']),
            wpe=nn.Embedding(c['block_size'], c['n_embd']),
            h=nn.ModuleList([Block(c) for _ in range(c['n_layer'])]),
            ln_f=LayerNorm(c['n_embd'], c['bias'])))
        self.lm_head = nn.Linear(c['n_embd'], c['vocab'], bias=False)
        self.lm_head.weight = self.transformer.wte.weight

    def forward(self, idx, targets):
        T = idx.size(1)
        x = self.transformer.wte(idx) + self.transformer.wpe(torch.arange(T))
        for b in self.transformer.h:
            x = b(x)
        logits = self.lm_head(self.transformer.ln_f(x))
        loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1), ignore_index=-1)
        return logits, loss


def train_case(d, name, c):
    model = GPT(c)
    weights = read_safetensors(f'{d}/{name}.weights.safetensors')
    model.load_state_dict(weights, strict=True)
    if not torch.equal(model.lm_head.weight, weights['transformer.wte.weight']):
        raise SystemExit(f'{name}: lm_head is not tied')
    inputs = read_safetensors(f'{d}/{name}.inputs.safetensors')
    idx, tgt = inputs['idx'], inputs['targets']

    out = {}
    logits, loss = model(idx[0], tgt[0])
    loss.backward()
    out['logits'] = logits
    out['loss'] = loss.reshape(())
    for pn, p in model.named_parameters():
        out[f'grad.{pn}'] = p.grad.clone()
    model.zero_grad(set_to_none=True)

    # nanoGPT's configure_optimizers: every parameter of dim >= 2 decays, the rest not.
    params = {pn: p for pn, p in model.named_parameters() if p.requires_grad}
    groups = [{'params': [p for p in params.values() if p.dim() >= 2], 'weight_decay': c['wd']},
              {'params': [p for p in params.values() if p.dim() < 2], 'weight_decay': 0.0}]
    opt = torch.optim.AdamW(groups, lr=c['lr'], betas=(0.9, 0.95))
    losses = []
    for s in range(c['steps']):
        opt.zero_grad(set_to_none=True)
        _, loss = model(idx[s], tgt[s])
        loss.backward()
        losses.append(loss.item())
        opt.step()
    out['losses'] = torch.tensor(losses, dtype=torch.float64)
    for pn, p in model.named_parameters():
        out[f'final.{pn}'] = p.detach().clone()
    write_safetensors(f'{d}/{name}.torch.safetensors', out)
    print(f'{name}: loss {loss.item():.6f} after {c["steps"]} steps')


# ---------------------------------------------------------------- Hugging Face's layout
class Conv1D(nn.Module):
    """transformers' Conv1D: weight (in, out), y = x W + b."""
    def __init__(self, nf, nx):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(nx, nf) * 0.1)
        self.bias = nn.Parameter(torch.randn(nf) * 0.1)

    def forward(self, x):
        return x @ self.weight + self.bias


def hf_case(d, name, c):
    torch.manual_seed(1234)
    L, H, C, P, V = c['n_layer'], c['n_head'], c['n_embd'], c['block_size'], c['vocab']
    sd = {'wte.weight': torch.randn(V, C) * 0.5, 'wpe.weight': torch.randn(P, C) * 0.1}
    for i in range(L):
        h = f'h.{i}.'
        for ln in ('ln_1', 'ln_2'):
            sd[h + ln + '.weight'] = 1 + 0.1 * torch.randn(C)
            sd[h + ln + '.bias'] = 0.1 * torch.randn(C)
        # The causal mask buffers GPT2Model keeps in its state dict.
        sd[h + 'attn.bias'] = torch.tril(torch.ones(P, P)).view(1, 1, P, P)
        sd[h + 'attn.masked_bias'] = torch.tensor(-1e4)
        for key, (nx, nf) in (('attn.c_attn', (C, 3 * C)), ('attn.c_proj', (C, C)), ('mlp.c_fc', (C, 4 * C)),
                              ('mlp.c_proj', (4 * C, C))):
            conv = Conv1D(nf, nx)
            sd[h + key + '.weight'] = conv.weight.detach()
            sd[h + key + '.bias'] = conv.bias.detach()
    sd['ln_f.weight'] = 1 + 0.1 * torch.randn(C)
    sd['ln_f.bias'] = 0.1 * torch.randn(C)
    write_safetensors(f'{d}/{name}.model.safetensors', sd)

    # The forward pass of GPT2LMHeadModel on these tensors (gelu_new is the tanh GELU; the
    # mask buffer selects the visible keys).
    idx = read_safetensors(f'{d}/{name}.inputs.safetensors')['idx']
    B, T = idx.shape
    x = sd['wte.weight'][idx] + sd['wpe.weight'][:T]
    for i in range(L):
        h = f'h.{i}.'
        ln = lambda y, k: F.layer_norm(y, (C,), sd[h + k + '.weight'], sd[h + k + '.bias'], 1e-5)
        qkv = ln(x, 'ln_1') @ sd[h + 'attn.c_attn.weight'] + sd[h + 'attn.c_attn.bias']
        q, k, v = [t.view(B, T, H, C // H).transpose(1, 2) for t in qkv.split(C, dim=2)]
        w = (q @ k.transpose(-1, -2)) / math.sqrt(C // H)
        mask = sd[h + 'attn.bias'][:, :, :T, :T].bool()
        w = torch.where(mask, w, torch.tensor(torch.finfo(w.dtype).min))
        y = (F.softmax(w, dim=-1) @ v).transpose(1, 2).reshape(B, T, C)
        x = x + y @ sd[h + 'attn.c_proj.weight'] + sd[h + 'attn.c_proj.bias']
        m = F.gelu(ln(x, 'ln_2') @ sd[h + 'mlp.c_fc.weight'] + sd[h + 'mlp.c_fc.bias'], approximate='tanh')
        x = x + m @ sd[h + 'mlp.c_proj.weight'] + sd[h + 'mlp.c_proj.bias']
    x = F.layer_norm(x, (C,), sd['ln_f.weight'], sd['ln_f.bias'], 1e-5)
    write_safetensors(f'{d}/{name}.torch.safetensors', {'logits': x @ sd['wte.weight'].t()})
    print(f'{name}: wrote a {L}-layer GPT-2 in the Hugging Face layout')


def main(d):
    torch.set_num_threads(2)
    for line in open(f'{d}/manifest.txt'):
        name, mode, *kv = line.split()
        c = dict(a.split('=', 1) for a in kv)
        for k in ('n_layer', 'n_head', 'n_embd', 'block_size', 'vocab', 'experts', 'rank', 'steps'):
            c[k] = int(c.get(k, 0))
        c['bias'] = c.get('bias', '1') == '1'
        for k in ('lr', 'wd'):
            c[k] = float(c.get(k, 0))
        (train_case if mode == 'train' else hf_case)(d, name, c)


if __name__ == '__main__':
    main(sys.argv[1])
