#!/usr/bin/python3
"""PyTorch side of bench_generate: the same sampling loops, in the same JSON shape.

    /usr/bin/python3 experiments/bench/torch_generate.py [--threads 2] [--reps 3] [--model mini|124m]
                                                          [--device cpu|cuda]

The model is torch_reference.py's GPT (nanoGPT layout, dense MLP) at gpt2-mini's or GPT-2
124M's size, in eval mode without autograd; B sequences of a P-token prompt grown by N
greedy tokens. Where the reference is not beside the repository (a GPU machine), the same
model from torch_gpu.py (checked against the reference by `torch_gpu.py check`). On cuda
every call is followed by torch.cuda.synchronize before the clock is read. Two loops, each
timed as a whole call:
  generate-<model>-whole-context   nanoGPT's generate: the whole context forwarded every step;
  generate-<model>-kv-cache        the prompt forwarded once, then one position a step, each
                                   block's keys and values appended to a cache (torch.cat).
"""
import argparse
import importlib.util
import math
import os
import statistics
import sys

import torch
import torch.nn.functional as F

from torch_timing import report, timed  # beside this file

HERE = os.path.dirname(os.path.abspath(__file__))


def load_reference():
    """torch_reference.py, imported from where it is found ($MUMOE_TORCH_REFERENCE, or the
    shared folder beside the checkout or inside it), or None."""
    for p in [os.environ.get('MUMOE_TORCH_REFERENCE'), os.path.join(HERE, '../../../shared/reference/torch_reference.py'),
              os.path.join(HERE, '../../shared/reference/torch_reference.py')]:
        if p and os.path.isfile(p):
            spec = importlib.util.spec_from_file_location('torch_reference', p)
            ref = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(ref)
            return ref
    return None


def load_model_module():
    """torch_reference.py where it is found, else torch_gpu.py's copy of its models."""
    ref = load_reference()
    if ref is not None:
        return ref
    import torch_gpu  # beside this file
    return torch_gpu


def attend(attn, x, cache):
    """attn's forward on the new positions x (B, T, C); cache: [k, v] of the positions before (or None)."""
    B, T, C = x.shape
    q, k, v = attn.c_attn(x).split(C, dim=2)
    q, k, v = [t.view(B, T, attn.h, C // attn.h).transpose(1, 2) for t in (q, k, v)]
    if cache[0] is not None:
        k, v = torch.cat([cache[0], k], 2), torch.cat([cache[1], v], 2)
    cache[0], cache[1] = k, v
    att = (q @ k.transpose(-2, -1)) / math.sqrt(C // attn.h)
    if T > 1:  # the prompt: causal; one new position sees every key
        att = att.masked_fill(torch.triu(torch.ones(T, T, dtype=torch.bool, device=x.device), 1), float('-inf'))
    y = F.softmax(att, dim=-1) @ v
    return attn.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))


def last_logits(m, idx, pos0, caches):
    """The logits of idx's last position; idx holds positions pos0.. (caches: None for no cache)."""
    T = idx.shape[1]
    x = m.wte(idx) + m.wpe(torch.arange(pos0, pos0 + T, device=idx.device))
    for i, b in enumerate(m.h):
        x = x + (b.attn(b.ln_1(x)) if caches is None else attend(b.attn, b.ln_1(x), caches[i]))
        x = x + b.mlp(b.ln_2(x))
    return m.lm_head(m.ln_f(x[:, -1, :]))


def generate(m, idx, n, cached):
    caches = [[None, None] for _ in m.h] if cached else None
    seq = idx
    for s in range(n):
        if cached:
            logits = last_logits(m, seq if s == 0 else seq[:, -1:], 0 if s == 0 else seq.shape[1] - 1, caches)
        else:
            logits = last_logits(m, seq, 0, None)
        seq = torch.cat([seq, logits.argmax(-1, keepdim=True)], 1)
    return seq


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('--threads', type=int, default=2)
    ap.add_argument('--reps', type=int, default=3)
    ap.add_argument('--warmup', type=int, default=1)
    ap.add_argument('--model', choices=['mini', '124m'], default='mini')
    ap.add_argument('--batch', type=int, default=1)
    ap.add_argument('--prompt', type=int, default=64)
    ap.add_argument('--new', type=int, default=64)
    ap.add_argument('--device', choices=['cpu', 'cuda'], default='cpu')
    ap.add_argument('--dtype', choices=['float32', 'bf16'], default='float32')  # bf16: under torch.autocast
    a = ap.parse_args()
    if a.device == 'cuda' and not torch.cuda.is_available():
        print('torch_generate.py: --device cuda, but torch sees no CUDA device', file=sys.stderr)
        sys.exit(3)
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    models = load_model_module()
    layers, heads, d, block = (4, 4, 256, 128) if a.model == 'mini' else (12, 12, 768, 1024)
    m = models.GPT(50257, block, layers, heads, d).eval().to(a.device)
    idx = torch.randint(0, 50257, (a.batch, a.prompt)).to(a.device)

    def call(cached):
        with torch.autocast(device_type=a.device, dtype=torch.bfloat16, enabled=a.dtype == 'bf16'):
            out = generate(m, idx, a.new, cached)
        if a.device == 'cuda':
            torch.cuda.synchronize()
        return out

    with torch.no_grad():
        # A note, not a failure: on a GPU the whole-context loop's fused attention and the
        # cached loop's plain one round differently, and a near tie may then go either way.
        differ = int((call(True) != call(False)).sum())
        if differ:
            print(f'torch_generate.py: the two loops chose {differ} different greedy tokens', file=sys.stderr)
        for cached in (False, True):
            ts = timed(lambda: call(cached), a.reps, a.warmup)
            name = f"generate-{a.model}-{'kv-cache' if cached else 'whole-context'}"
            name += '-bf16' if a.dtype == 'bf16' else ''
            report(name, ts, a.threads, device=a.device, batch=a.batch, prompt=a.prompt, new=a.new,
                   new_tokens_per_s=round(a.batch * a.new / (statistics.median(ts) * 1e-3), 1))


if __name__ == '__main__':
    main()
