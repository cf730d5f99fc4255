#!/usr/bin/python3
"""PyTorch side of bench_attention: causal attention composed from ops, as the
reference GPT-2 block writes it (torch 1.13 has no F.scaled_dot_product_attention):
softmax(q k^T / sqrt(D) + mask) v with autograd, float32. One step = clear the grads,
sum(out * w).backward() for a fixed random w. Prints one JSON line per workload, in the
shape of shared/reference/torch_reference.py.

  /usr/bin/python3 torch_attention.py [--workload a,b] [--threads 2] [--reps 20] [--warmup 3]
"""
import argparse, json, math, statistics, time

import torch
import torch.nn.functional as F

WORKLOADS = {'attention-b8-h4-t128': (8, 4, 128, 64), 'attention-b1-h12-t1024': (1, 12, 1024, 64)}


def attention(q, k, v, mask):
    att = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
    att = att.masked_fill(mask, float('-inf'))
    return F.softmax(att, dim=-1) @ v


def bench(name, reps, warmup):
    torch.manual_seed(0)
    B, H, T, D = WORKLOADS[name]
    q, k, v = [torch.randn(B, H, T, D, requires_grad=True) for _ in range(3)]
    w = torch.randn(B, H, T, D)
    mask = torch.triu(torch.ones(T, T, dtype=torch.bool), 1)

    def step():
        for t in (q, k, v): t.grad = None
        (attention(q, k, v, mask) * w).sum().backward()

    for _ in range(warmup): step()
    ts = []
    for _ in range(reps):
        t = time.perf_counter(); step(); ts.append((time.perf_counter() - t) * 1e3)
    print(json.dumps({'workload': name, 'impl': 'pytorch-' + torch.__version__, 'threads': torch.get_num_threads(),
                      'median_ms': round(statistics.median(ts), 3), 'min_ms': round(min(ts), 3),
                      'max_ms': round(max(ts), 3)}), flush=True)


if __name__ == '__main__':
    ap = argparse.ArgumentParser()
    ap.add_argument('--workload', default=','.join(WORKLOADS))
    ap.add_argument('--threads', type=int, default=2)
    ap.add_argument('--reps', type=int, default=20)
    ap.add_argument('--warmup', type=int, default=3)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    for w in a.workload.split(','):
        bench(w, a.reps, a.warmup)
