#!/usr/bin/env python3
"""PyTorch side of bench_gpu_gpt2 and bench_gpu_layers: the same workloads in PyTorch
eager on cuda:0, timed the same way (warm-up steps, then each step followed by
torch.cuda.synchronize before the clock is read), printing JSON lines with the same fields.

  python3 torch_gpu.py gpt2   [--workload gpt2-124m,gpt2-124m-cpmumoe] [--dtype bf16] ...
  python3 torch_gpu.py layers [--workload cpmumoe-layer,...] [--dtype fp32,bf16] ...
  python3 torch_gpu.py check  [--reference PATH]     (no GPU needed; see below)

bf16 is torch.autocast('cuda', dtype=torch.bfloat16) over float32 weights (the layers'
attention workloads use bfloat16 q, k, v themselves); attention is
F.scaled_dot_product_attention (is_causal=True); the optimiser torch.optim.AdamW(fused=True)
with lr 6e-4 and weight decay 0.1 on every parameter. Needs PyTorch 2 for those.

The models are those of shared/reference/torch_reference.py (the contract), written here
with explicit devices, because the reference's forward passes create tensors on the
default (CPU) device, and making cuda the default device would put a Python hook in front
of every torch call of the timed steps. `check` builds both versions of every model on the
CPU and fails unless their parameter names and shapes agree, and unless the μMoE layers
compute the same outputs with the same weights. Without a GPU, gpt2 and layers exit with
status 3 and a message.
"""
import argparse, importlib.util, json, math, os, statistics, sys, time

import torch
import torch.nn as nn
import torch.nn.functional as F

# Dense tensor-core peaks of the H100 SXM5 in TFLOP/s (NVIDIA H100 Tensor Core GPU datasheet,
# "H100 SXM" column, without sparsity); the H200 has the same. As in gpu_timing.h.
H100_BF16_DENSE_TFLOPS = 989.4
H100_TF32_DENSE_TFLOPS = 494.7
H100_FP32_TFLOPS = 66.9  # CUDA cores, no tensor cores

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))


# ---------------------------------------------------------------- the reference's models, device-explicit
def entmax15(x, dim=-1):
    """Exact entmax-1.5 by sorting (the reference's algorithm), in float32 as mumoe's
    autocast keeps entmax; at least one entry stays in the support (exactly true, but a
    low-precision cumsum can put tau above every entry, and gather would then read
    index -1)."""
    x = x.float() / 2
    x = x - x.max(dim=dim, keepdim=True).values
    xs, _ = torch.sort(x, dim=dim, descending=True)
    d = x.shape[dim]
    shape = [1] * x.dim(); shape[dim] = d
    rho = torch.arange(1, d + 1, device=x.device, dtype=x.dtype).view(shape)
    mean = xs.cumsum(dim) / rho
    mean_sq = (xs ** 2).cumsum(dim) / rho
    delta = (1 - rho * (mean_sq - mean ** 2)) / rho
    tau = mean - torch.sqrt(torch.clamp(delta, 0))
    support = (tau <= xs).sum(dim=dim, keepdim=True).clamp(min=1)
    return torch.clamp(x - tau.gather(dim, support - 1), min=0) ** 2


def with_ones(z):
    # [z; 1] with a float32 column on z's device, as the reference's torch.ones(...) (whose
    # float32 makes cat promote a bf16 z to float32 under autocast; the matmul then casts back).
    return torch.cat([z, torch.ones(*z.shape[:-1], 1, device=z.device)], dim=-1)


class CPMuMoE(nn.Module):
    """y = U3^T ((U1^T a) * (U2^T [z;1])); U1 (N,R), U2 (I+1,R), U3 (O,R)."""
    def __init__(self, i, o, n, r):
        super().__init__()
        self.U1 = nn.Parameter(torch.randn(n, r) + 1.0)
        k = 1 / math.sqrt(i); self.U2 = nn.Parameter(torch.empty(i + 1, r).uniform_(-k, k))
        k = 1 / math.sqrt(r); self.U3 = nn.Parameter(torch.empty(o, r).uniform_(-k, k))

    def forward(self, z, a):
        return ((a @ self.U1) * (with_ones(z) @ self.U2)) @ self.U3.t()

    def macs_per_token(self):  # a U1, [z;1] U2, the Hadamard product, U3 (as MuMoELayer counts)
        (n, r), (i1, _), (o, _) = self.U1.shape, self.U2.shape, self.U3.shape
        return r * (n + i1 + o) + r


class TRMuMoE(nn.Module):
    """Tensor-ring cores U1 (R1,N,R2), U2 (R2,I+1,R3), U3 (R3,O,R1)."""
    def __init__(self, i, o, n, r1, r2, r3):
        super().__init__()
        U1 = torch.zeros(r1, n, r2)
        for e in range(n):
            U1[:, e, :] = torch.eye(r1, r2) * (torch.randn(r1, r2) + 1.0)
        self.U1 = nn.Parameter(U1)
        k = 1 / math.sqrt(i); self.U2 = nn.Parameter(torch.empty(r2, i + 1, r3).uniform_(-k, k))
        k = 1 / math.sqrt(r3 * r1); self.U3 = nn.Parameter(torch.empty(r3, o, r1).uniform_(-k, k))

    def forward(self, z, a):
        f1 = torch.einsum('btn,anc->btac', a, self.U1)
        f2 = torch.einsum('bti,cid->btcd', with_ones(z), self.U2)
        return torch.einsum('doa,btad->bto', self.U3, torch.einsum('btac,btcd->btad', f1, f2))

    def macs_per_token(self):  # the four contractions (as MuMoELayer counts)
        (r1, n, r2), (_, i1, r3), (_, o, _) = self.U1.shape, self.U2.shape, self.U3.shape
        return r1 * n * r2 + r2 * i1 * r3 + r1 * r2 * r3 + r1 * o * r3


class MuMoEBlock(nn.Module):
    """a = entmax15(LN(x G)); y = L2(GELU(L1(LN(x), a)), a)."""
    def __init__(self, d, hidden, n, kind, rank):
        super().__init__()
        self.G = nn.Parameter(torch.zeros(d, n))
        self.gate_ln = nn.LayerNorm(n, elementwise_affine=False)
        self.in_ln = nn.LayerNorm(d)
        if kind == 'cp':
            self.l1, self.l2 = CPMuMoE(d, hidden, n, rank), CPMuMoE(hidden, d, n, rank)
        else:
            self.l1, self.l2 = TRMuMoE(d, hidden, n, 4, 4, rank), TRMuMoE(hidden, d, n, 4, 4, rank)

    def forward(self, x):
        a = entmax15(self.gate_ln(x @ self.G))
        return self.l2(F.gelu(self.l1(self.in_ln(x), a)), a)

    def macs_per_token(self):  # the gating x G, then both layers
        return self.G.numel() + self.l1.macs_per_token() + self.l2.macs_per_token()


class Attention(nn.Module):
    def __init__(self, d, h):
        super().__init__(); self.h = h
        self.c_attn = nn.Linear(d, 3 * d); self.c_proj = nn.Linear(d, d)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)
        q, k, v = [t.view(B, T, self.h, C // self.h).transpose(1, 2) for t in (q, k, v)]
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # the fused kernel
        return self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))


class Block(nn.Module):
    def __init__(self, d, h, mlp, n_experts):
        super().__init__()
        self.ln_1 = nn.LayerNorm(d); self.attn = Attention(d, h)
        self.mlp_kind = mlp
        if mlp == 'mlp':
            self.ln_2 = nn.LayerNorm(d)
            self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(approximate='tanh'), nn.Linear(4 * d, d))
        elif mlp == 'cpmumoe':
            self.mlp = MuMoEBlock(d, 4 * d, n_experts, 'cp', int(d * (0.78 if n_experts == 64 else 0.725)))
        else:
            self.mlp = MuMoEBlock(d, 4 * d, n_experts, 'tr', int(d * (0.2 if n_experts == 64 else 0.195)))

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + (self.mlp(self.ln_2(x)) if self.mlp_kind == 'mlp' else self.mlp(x))


class GPT(nn.Module):
    def __init__(self, vocab, block, n_layer, n_head, d, mlp='mlp', n_experts=64):
        super().__init__()
        self.wte = nn.Embedding(vocab, d); self.wpe = nn.Embedding(block, d)
        self.h = nn.ModuleList([Block(d, n_head, mlp, n_experts) for _ in range(n_layer)])
        self.ln_f = nn.LayerNorm(d)
        self.lm_head = nn.Linear(d, vocab, bias=False); self.lm_head.weight = self.wte.weight

    def forward(self, idx, targets):
        B, T = idx.shape
        x = self.wte(idx) + self.wpe(torch.arange(T, device=idx.device))
        for b in self.h: x = b(x)
        logits = self.lm_head(self.ln_f(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))

    def flops_per_token(self, T):
        """6 x the weight matmuls' multiply-adds per token + 12 L T d for attention (as
        bench_gpu_gpt2 counts: nanoGPT's and llm.c's rule, the MLP by its own shapes)."""
        V, d = self.wte.weight.shape
        macs = V * d  # the tied lm_head
        for b in self.h:
            macs += 4 * d * d  # c_attn and attn.c_proj
            macs += 8 * d * d if b.mlp_kind == 'mlp' else b.mlp.macs_per_token()
        return 6 * macs + 12 * len(self.h) * T * d


# ---------------------------------------------------------------- workloads
GPT2_WORKLOADS = {'gpt2-124m': 'mlp', 'gpt2-124m-cpmumoe': 'cpmumoe'}
LAYER_WORKLOADS = ['cpmumoe-layer', 'trmumoe-layer', 'attention-b8-h12-t1024-fwd', 'attention-b8-h12-t1024-fwd-bwd',
                   'topk-b8-v50257-k200']


def gpt2_model(name, ns=sys.modules[__name__]):
    # GPT-2 124M: 12 layers, 12 heads, width 768, context 1024, vocabulary 50257; N = 256 experts.
    return ns.GPT(50257, 1024, 12, 12, 768, GPT2_WORKLOADS[name], 256)


def layer_model(name, ns=sys.modules[__name__]):
    # 768 -> 768, N = 256, CP rank 512 or TR ranks (4, 4, 149), as the reference's layer().
    return ns.CPMuMoE(768, 768, 256, 512) if name == 'cpmumoe-layer' else ns.TRMuMoE(768, 768, 256, 4, 4, 149)


def time_steps(step, reps, warmup):
    """Median, min and max ms of `step` followed by torch.cuda.synchronize, after warm-up."""
    for _ in range(warmup):
        step(); torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        t = time.perf_counter(); step(); torch.cuda.synchronize(); ts.append((time.perf_counter() - t) * 1e3)
    return statistics.median(ts), min(ts), max(ts)


def line(workload, dtype, tf32, times, **extra):
    out = {'workload': workload, 'impl': 'pytorch-' + torch.__version__, 'threads': 0,
           'device': torch.cuda.get_device_name(0), 'dtype': dtype, 'tf32': tf32,
           'median_ms': round(times[0], 3), 'min_ms': round(times[1], 3), 'max_ms': round(times[2], 3)}
    out.update(extra)
    print(json.dumps(out), flush=True)


def peak_tflops(bf16, tf32, override):
    if override > 0: return override
    return H100_BF16_DENSE_TFLOPS if bf16 else (H100_TF32_DENSE_TFLOPS if tf32 else H100_FP32_TFLOPS)


def bench_gpt2(name, dtype, a):
    bf16 = dtype == 'bf16'
    B, T = a.batch, a.seq
    if T > 1024: sys.exit(f'torch_gpu.py: --seq {T} exceeds the context 1024')
    torch.cuda.empty_cache(); torch.cuda.reset_peak_memory_stats()
    torch.manual_seed(0)
    m = gpt2_model(name).cuda()
    opt = torch.optim.AdamW(m.parameters(), lr=6e-4, weight_decay=0.1, fused=True)
    idx = torch.randint(0, 50257, (B, T)).cuda(); tgt = torch.randint(0, 50257, (B, T)).cuda()

    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast('cuda', dtype=torch.bfloat16, enabled=bf16):
            loss = m(idx, tgt)
        loss.backward(); opt.step()

    times = time_steps(step, a.reps, a.warmup)
    if a.profile:  # one more step under torch.profiler: its kernels by GPU time, on stderr
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            step(); torch.cuda.synchronize()
        print(f'torch profile of one step of {name}-{dtype}:', file=sys.stderr)
        print(prof.key_averages().table(sort_by='cuda_time_total', row_limit=30), file=sys.stderr)
    fpt = m.flops_per_token(T)
    tokens_per_s = B * T / (times[0] * 1e-3)
    tflops = fpt * tokens_per_s / 1e12
    peak = peak_tflops(bf16, a.tf32, a.peak_tflops)
    line(name + '-' + dtype, dtype, a.tf32, times, params=sum(p.numel() for p in m.parameters()), batch=B, seq=T,
         tokens_per_s=round(tokens_per_s), flops_per_token=fpt, tflops=round(tflops, 2), peak_tflops=peak,
         mfu=round(tflops / peak, 4), peak_memory_mb=round(torch.cuda.max_memory_allocated() / 2**20, 1))


def bench_layer(name, dtype, a):
    bf16 = dtype == 'bf16'
    torch.manual_seed(0)
    if name.endswith('-layer'):
        tokens = 2048
        m = layer_model(name).cuda()
        z = torch.randn(1, tokens, 768).cuda().requires_grad_()
        c = entmax15(torch.randn(1, tokens, 256)).cuda().requires_grad_()

        def step():
            for t in (*m.parameters(), z, c): t.grad = None
            with torch.autocast('cuda', dtype=torch.bfloat16, enabled=bf16):
                loss = m(z, c).square().mean()
            loss.backward()

        # forward 2 flops per multiply-add, backward twice that
        layer_line(name, dtype, a, time_steps(step, a.reps, a.warmup), 6 * tokens * m.macs_per_token())
        return
    if name.startswith('topk-'):
        x = torch.randn(8, 50257).to(torch.bfloat16 if bf16 else torch.float32).cuda()

        def step():
            with torch.no_grad(): torch.topk(x, 200, dim=1)

        times = time_steps(step, a.reps, a.warmup)
        nbytes = x.numel() * x.element_size()
        line(name + '-' + dtype, dtype, a.tf32, times, bytes=nbytes, gb_per_s=round(nbytes / (times[0] * 1e-3) / 1e9, 2))
        return
    B, H, T, D = 8, 12, 1024, 64
    dt = torch.bfloat16 if bf16 else torch.float32
    q, k, v = [torch.randn(B, H, T, D).to(dt).cuda().requires_grad_() for _ in range(3)]
    w = torch.randn(B, H, T, D).to(dt).cuda()
    bhttd = B * H * T * T * D
    if name.endswith('-fwd'):
        def step():
            with torch.no_grad(): F.scaled_dot_product_attention(q, k, v, is_causal=True)
        flops = 2 * bhttd  # S = Q Kᵀ and O = P V, the causal half
    else:
        def step():
            for t in (q, k, v): t.grad = None
            (F.scaled_dot_product_attention(q, k, v, is_causal=True) * w).sum().backward()
        flops = 7 * bhttd  # those two, then S again, dP, dV, dQ, dK
    layer_line(name, dtype, a, time_steps(step, a.reps, a.warmup), flops)


def layer_line(name, dtype, a, times, flops):
    line(name + '-' + dtype, dtype, a.tf32, times, flops=flops, tflops=round(flops / (times[0] * 1e-3) / 1e12, 2))


# ---------------------------------------------------------------- check: the models against the reference
def find_reference(path):
    for p in [path, os.environ.get('MUMOE_TORCH_REFERENCE'), os.path.join(REPO, 'shared/reference/torch_reference.py'),
              os.path.join(REPO, '../shared/reference/torch_reference.py')]:
        if p and os.path.isfile(p): return os.path.normpath(p)
    return None


def check(path):
    ref_path = find_reference(path)
    if ref_path is None:
        sys.exit('torch_gpu.py check: torch_reference.py not found (give --reference PATH)')
    spec = importlib.util.spec_from_file_location('torch_reference', ref_path)
    ref = importlib.util.module_from_spec(spec); spec.loader.exec_module(ref)
    me = sys.modules[__name__]

    def shapes(m):
        return [(n, tuple(p.shape)) for n, p in m.named_parameters()]

    models = [(w, lambda ns, w=w: gpt2_model(w, ns)) for w in GPT2_WORKLOADS]
    models += [(w, lambda ns, w=w: layer_model(w, ns)) for w in LAYER_WORKLOADS if w.endswith('-layer')]
    for name, make in models:
        torch.manual_seed(0); mine = make(me)
        torch.manual_seed(0); theirs = make(ref)
        if shapes(mine) != shapes(theirs):
            sys.exit(f'torch_gpu.py check: {name}: parameters differ from {ref_path}:\n{shapes(mine)}\n{shapes(theirs)}')
        if name.endswith('-layer'):  # same weights, same input: same output
            mine.load_state_dict(theirs.state_dict())
            z = torch.randn(1, 64, 768); c = ref.entmax15(torch.randn(1, 64, 256))
            if not torch.allclose(entmax15(c), ref.entmax15(c)):
                sys.exit('torch_gpu.py check: entmax15 differs from the reference')
            diff = (mine(z, c) - theirs(z, c)).abs().max().item()
            if diff > 1e-5:
                sys.exit(f'torch_gpu.py check: {name}: outputs differ from the reference by {diff}')
        print(f'{name}: {sum(p.numel() for _, p in mine.named_parameters())} parameters, as {ref_path}', flush=True)


if __name__ == '__main__':
    ap = argparse.ArgumentParser()
    ap.add_argument('cmd', choices=['gpt2', 'layers', 'check'])
    ap.add_argument('--workload', default=None)
    ap.add_argument('--dtype', default=None, help='comma-separated: bf16, fp32 (gpt2: bf16; layers: fp32,bf16)')
    ap.add_argument('--tf32', type=int, choices=[0, 1], default=0)
    ap.add_argument('--batch', type=int, default=8)
    ap.add_argument('--seq', type=int, default=1024)
    ap.add_argument('--peak-tflops', type=float, default=0)
    ap.add_argument('--reps', type=int, default=None, help='gpt2: 10, layers: 20')
    ap.add_argument('--warmup', type=int, default=3)
    ap.add_argument('--profile', type=int, choices=[0, 1], default=0, help='gpt2: a kernel table of one step on stderr')
    ap.add_argument('--reference', default=None, help='torch_reference.py, for check')
    a = ap.parse_args()
    if a.cmd == 'check':
        check(a.reference); sys.exit(0)
    if not torch.cuda.is_available():
        print(f'torch_gpu.py: no CUDA device (torch {torch.__version__}: torch.cuda.is_available() is False); '
              'this benchmark runs on a GPU only', file=sys.stderr)
        sys.exit(3)
    a.tf32 = bool(a.tf32)
    torch.backends.cuda.matmul.allow_tf32 = a.tf32  # float32 matmuls on TF32 tensor cores only when asked
    torch.backends.cudnn.allow_tf32 = a.tf32
    gpt2 = a.cmd == 'gpt2'
    a.reps = a.reps or (10 if gpt2 else 20)
    workloads = (a.workload or ','.join(GPT2_WORKLOADS if gpt2 else LAYER_WORKLOADS)).split(',')
    for dtype in (a.dtype or ('bf16' if gpt2 else 'fp32,bf16')).split(','):
        if dtype not in ('bf16', 'fp32'): sys.exit(f'torch_gpu.py: --dtype {dtype} is not bf16 or fp32')
        for w in workloads:
            if w not in (GPT2_WORKLOADS if gpt2 else LAYER_WORKLOADS): sys.exit(f'torch_gpu.py: unknown workload {w}')
            (bench_gpt2 if gpt2 else bench_layer)(w, dtype, a)
