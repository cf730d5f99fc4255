#!/usr/bin/python3
"""PyTorch side of `bench_gpt2 --dtype bf16`: the reference's gpt2-mini workloads
(../shared/reference/torch_reference.py, imported as they are, found as torch_generate.py
finds it) with each step run under
torch.autocast on the CPU in bfloat16, in the reference's JSON shape, the workloads named
...-bf16.

    /usr/bin/python3 experiments/bench/torch_gpt2_autocast.py [--threads 2] [--reps 10]
        [--workload gpt2-mini] [--dtype bf16]

The whole step (zero_grad, forward, backward, AdamW) sits inside the autocast region, as
the reference's step function is one closure: autocast changes only the forward's
eligible ops (products, attention), and the backward runs each op in the dtype its
forward ran in, so this is the usual forward-only region's work.

Only gpt2-mini: under torch.autocast the reference's CPmuMoE and TRmuMoE blocks fail in
their entmax15 on the bfloat16 gate logits (PyTorch 1.13: "index -1 is out of bounds for
dimension 2 with size 64" from its tau.gather), where mumoe keeps entmax in float32.
"""
import argparse
import sys

import torch

from torch_timing import report, timed  # beside this file
from torch_generate import load_reference  # the one lookup of torch_reference.py, beside this file


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('--threads', type=int, default=2)
    ap.add_argument('--reps', type=int, default=10)
    ap.add_argument('--warmup', type=int, default=3)
    ap.add_argument('--workload', default='gpt2-mini')
    ap.add_argument('--dtype', choices=['bf16'], default='bf16')
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    ref = load_reference()
    if ref is None:
        sys.exit('torch_gpt2_autocast.py: torch_reference.py not found ($MUMOE_TORCH_REFERENCE, or shared/reference '
                 'beside the checkout)')
    for name in a.workload.split(','):
        if name not in ref.WORKLOADS or not name.startswith('gpt2-'):
            sys.exit(f'torch_gpt2_autocast.py: {name} is not one of the reference\'s gpt2 workloads')
        torch.manual_seed(0)
        m, step = ref.WORKLOADS[name]()

        def autocast_step():
            with torch.autocast('cpu', dtype=torch.bfloat16):
                step()

        report(name + '-bf16', timed(autocast_step, a.reps, a.warmup), torch.get_num_threads(),
               impl='pytorch-' + torch.__version__ + '-autocast', params=sum(p.numel() for p in m.parameters()))


if __name__ == '__main__':
    main()
