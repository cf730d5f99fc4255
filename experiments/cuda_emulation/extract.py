# Cuts the text between two markers out of a source file (kernels of ops/cuda/*.cu or
# the pointer-level helpers of ops/cpu/*.cpp) and makes it host C++ for emu.h:
# `extern __shared__` arrays point at the emulated block's shared memory, `__shared__`
# variables become function statics (blocks run one after another, so one copy per
# kernel is one per block), and kernel<<<grid, block, smem, stream>>>(args) becomes an
# emu_launch_cfg call with the arguments bound at the launch; a kernel's
# __launch_bounds__(N) becomes a check of its block size (extract_lines.py). Usage: extract.py [--keep-tensor] SRC START END OUT [PREFIX [SUFFIX]]
# (--keep-tensor: the host functions keep mu::Tensor, for code that only reads a tensor's
# data pointer, size and dtype, run on CPU tensors.)
import os, re, sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from extract_lines import launch_bounds  # noqa: E402

keep_tensor = sys.argv[1] == '--keep-tensor'
if keep_tensor:
    del sys.argv[1]
src, start, end, out = sys.argv[1:5]
start, end = start.replace("\\n", "\n"), end.replace("\\n", "\n")  # markers may span lines
s = open(src).read()
i = s.index(start)
body = s[i:s.index(end, i)]

# extern __shared__ [__align__(n)] type name[];  ->  type* name = (type*)ctx->smem;
body = re.sub(r'extern __shared__ (?:__align__\(\d+\) )?([\w:]+(?: [\w:]+)*) (\w+)\[\];',
              r'\1* \2 = reinterpret_cast<\1*>(ctx->smem);', body)
body = re.sub(r'__shared__ (alignas\(\d+\)) ', r'\1 static ', body).replace('__shared__ ', 'static ')


def split_top(text):
    """Splits at the commas outside parentheses (no template arguments in a launch configuration)."""
    parts, depth, cur = [], 0, ''
    for ch in text:
        if ch in '([{':
            depth += 1
        elif ch in ')]}':
            depth -= 1
        if ch == ',' and depth == 0:
            parts.append(cur.strip())
            cur = ''
        else:
            cur += ch
    parts.append(cur.strip())
    return parts


def launch(m):
    name, cfg, args = m.group(1), m.group(2), m.group(3)
    c = split_top(cfg) + ['0', '0']
    # The arguments taken at the launch, by value (emu_bind), as CUDA takes them, so that
    # the launch may run later (emu_queue.h's deferred mode).
    bound = '::emu_bind([=](auto&&... emu_p) { %s(emu_p...); }%s%s)' % (name, ', ' if args.strip() else '', args)
    # The kernel named first, so that the launch checks its shared memory grant (emu.h).
    return '(::emu_next_kernel = "%s", emu_launch_cfg(%s, %s, %s, %s, %s));' % (
        name, c[0], c[1], c[2], c[3], bound)


# The host functions take EmuTensor (emu_host.h) and its lists in place of Tensor.
if not keep_tensor:
    body = re.sub(r'\bTensor\b', 'EmuTensor', body)
    body = re.sub(r'kernels::(AdamW|SGD)Tensors', r'Emu\1Tensors', body)
body = re.sub(r'([\w:]+(?:<[^;{}]*?>)?)<<<(.*?)>>>\((.*?)\);', launch, body, flags=re.S)
body = launch_bounds(body)
# PREFIX and SUFFIX: text around the cut (\\n for a newline).
prefix = sys.argv[5].replace('\\n', '\n') if len(sys.argv) > 5 else ''
suffix = sys.argv[6].replace('\\n', '\n') if len(sys.argv) > 6 else ''
open(out, 'w').write(prefix + '\n' + body + '\n' + suffix + '\n')
