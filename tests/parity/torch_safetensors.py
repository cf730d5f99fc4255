#!/usr/bin/python3
"""PyTorch side of the safetensors parity test (the `safetensors` package is not needed:
the format is parsed and written here with struct and json).

Usage: torch_safetensors.py DIR

(a) Reads DIR/mumoe.safetensors, written by mumoe, checks its layout (length prefix,
    header padded to 8 bytes, offsets covering the data region back to back, the
    mumoe.header_checksum and each tensor's hash in mumoe.data_checksum), turns every entry into a torch tensor and compares it, bit
    for bit, with the raw dump DIR/mumoe_raw/NAME.bin listed in DIR/mumoe_manifest.txt
    ("NAME DTYPE SHAPE" lines, SHAPE like 2x3, "scalar" or 0x4). Metadata must hold
    the pairs listed in DIR/mumoe_metadata.txt ("KEY VALUE" lines).
(b) Writes DIR/torch.safetensors from seeded torch tensors (every dtype of the format
    mumoe holds, 0-dim, empty, and torch's conversions between them: the cvt_ entries) the way Python writers do: json.dumps spacing, data in another order
    than the header, {"format": "pt"} metadata. Each tensor's raw bytes go to
    DIR/torch_raw/NAME.bin and DIR/torch_manifest.txt.
Exits non-zero, saying why, on any mismatch.
"""
import json
import os
import struct
import sys

import numpy as np
import torch

# numpy has no bfloat16: its bits travel as int16 and are viewed as torch.bfloat16.
NUMPY = {'F32': np.float32, 'F64': np.float64, 'I64': np.int64, 'BOOL': np.bool_, 'F16': np.float16,
         'BF16': np.int16, 'I8': np.int8, 'I16': np.int16, 'I32': np.int32, 'U8': np.uint8}
TORCH = {'F32': torch.float32, 'F64': torch.float64, 'I64': torch.int64, 'BOOL': torch.bool,
         'BF16': torch.bfloat16, 'F16': torch.float16, 'I8': torch.int8, 'I16': torch.int16,
         'I32': torch.int32, 'U8': torch.uint8}


def from_numpy(arr, dtype):
    t = torch.from_numpy(arr.copy())
    return t.view(torch.bfloat16) if dtype == 'BF16' else t


def raw_bytes(t):
    t = t.contiguous()
    return (t.view(torch.int16) if t.dtype == torch.bfloat16 else t).numpy().tobytes()
CHECKSUM_KEY = 'mumoe.header_checksum'
DATA_CHECKSUM_KEY = 'mumoe.data_checksum'
MASK64 = 0xFFFFFFFFFFFFFFFF


def fail(msg):
    print(f'torch_safetensors.py: {msg}', file=sys.stderr)
    sys.exit(1)


def parse_shape(s):
    return [] if s == 'scalar' else [int(d) for d in s.split('x')]


def fnv1a64(data):
    h = 0xcbf29ce484222325
    for b in data:
        h = ((h ^ b) * 0x100000001b3) & 0xFFFFFFFFFFFFFFFF
    return h


def data_hash(data):
    """mumoe's data checksum (tensor/safetensors.h): 64-bit little-endian words, the last
    one zero-padded, word i into lane i % 4, each step h = (h ^ w) * M; h ^= h >> 32."""
    def step(h, w):
        h = ((h ^ w) * 0x9e3779b97f4a7c15) & MASK64
        return h ^ (h >> 32)
    padded = data + b'\0' * ((8 - len(data) % 8) % 8)
    words = struct.unpack(f'<{len(padded) // 8}Q', padded)
    out = 0xcbf29ce484222325 ^ len(data)
    for lane in range(4):
        h = 0xcbf29ce484222325 + lane
        for w in words[lane::4]:
            h = step(h, w)
        out = step(out, h)
    return out


def read_mumoe(d):
    blob = open(f'{d}/mumoe.safetensors', 'rb').read()
    (n,) = struct.unpack('<Q', blob[:8])
    raw_header = blob[8:8 + n]
    if n % 8 != 0:
        fail(f'header length {n} is not a multiple of 8')
    header = json.loads(raw_header.decode('utf-8'))
    meta = header.pop('__metadata__', {})
    data = blob[8 + n:]

    # The checksum: FNV-1a 64 of the header with its 16 digits read as '0'.
    stored = meta.pop(CHECKSUM_KEY, None)
    if stored is None:
        fail('no mumoe.header_checksum in the metadata')
    prefix = f'"{CHECKSUM_KEY}":"'.encode()
    at = raw_header.index(prefix) + len(prefix)
    zeroed = raw_header[:at] + b'0' * 16 + raw_header[at + 16:]
    if f'{fnv1a64(zeroed):016x}' != stored:
        fail(f'header checksum {stored} does not match {fnv1a64(zeroed):016x}')

    sums = meta.pop(DATA_CHECKSUM_KEY, None)
    if sums is None:
        fail('no mumoe.data_checksum in the metadata')
    sums = sums.split(' ') if sums else []
    if len(sums) != len(header):
        fail(f'{len(sums)} data checksums for {len(header)} tensors')
    for (name, entry), stored in zip(header.items(), sums):
        begin, end = entry['data_offsets']
        if f'{data_hash(data[begin:end]):016x}' != stored:
            fail(f'{name}: data checksum {stored} does not match {data_hash(data[begin:end]):016x}')

    expected_meta = {}
    for line in open(f'{d}/mumoe_metadata.txt', encoding='utf-8'):
        key, value = line.rstrip('\n').split(' ', 1)
        expected_meta[key] = value
    if meta != expected_meta:
        fail(f'metadata {meta} != expected {expected_meta}')

    manifest = [line.split() for line in open(f'{d}/mumoe_manifest.txt')]
    if [m[0] for m in manifest] != list(header.keys()):
        fail(f'header entries {list(header.keys())} are not the manifest order {[m[0] for m in manifest]}')
    covered = 0
    for name, dtype, shape in manifest:
        entry = header[name]
        if set(entry) != {'dtype', 'shape', 'data_offsets'}:
            fail(f'{name}: keys {sorted(entry)}')
        if entry['dtype'] != dtype or entry['shape'] != parse_shape(shape):
            fail(f'{name}: header says {entry["dtype"]} {entry["shape"]}, expected {dtype} {shape}')
        begin, end = entry['data_offsets']
        if begin != covered:
            fail(f'{name}: data starts at {begin}, expected {covered} (back to back, in order)')
        covered = end
        chunk = data[begin:end]
        arr = np.frombuffer(chunk, dtype=NUMPY[dtype]).reshape(entry['shape'])
        t = from_numpy(arr, dtype)
        if t.dtype != TORCH[dtype] or list(t.shape) != entry['shape']:
            fail(f'{name}: torch built {t.dtype} {list(t.shape)}')
        raw = open(f'{d}/mumoe_raw/{name}.bin', 'rb').read()
        ref = from_numpy(np.frombuffer(raw, dtype=NUMPY[dtype]).reshape(entry['shape']), dtype)
        if chunk != raw or not torch.equal(t, ref):
            fail(f'{name}: values differ from the raw dump')
    if covered != len(data):
        fail(f'entries cover {covered} of {len(data)} data bytes')
    print(f'read {len(manifest)} tensors written by mumoe')


def write_torch(d):
    torch.manual_seed(1234)
    tensors = {
        'weight': torch.randn(5, 7),
        'double': torch.randn(4, dtype=torch.float64),
        'index': torch.randint(-10**12, 10**12, (3, 3)),
        'scalar': torch.tensor(3.25),
        'scalar_f64': torch.tensor(-1e-300, dtype=torch.float64),
        'flag': torch.randn(6) > 0,
        'half': torch.randn(2, 3).to(torch.bfloat16),
        'empty': torch.empty(0, 2),
        'transposed': torch.randn(3, 4).t(),  # written contiguous, as every writer must
        'i8': torch.randint(-128, 128, (7,), dtype=torch.int8),
        'i16': torch.randint(-2**15, 2**15, (2, 3), dtype=torch.int16),
        'i32': torch.randint(-2**31, 2**31, (5,), dtype=torch.int32),
        'u8': torch.randint(0, 256, (4, 2), dtype=torch.uint8),
    }
    # Conversions: a float32 source, torch's float16 and bfloat16 roundings of it, and their
    # float32 widenings; the narrow integers from int64 (wrapping as C does) and back.
    special = [0.0, -0.0, 1.0, -2.5, 0.1, 1 / 3, 65504.0, 65519.99, 65520.0, 1e5, -1e5, 6.1e-5, 6.103515625e-05,
               5.96e-8, 2.9802322387695312e-08, 3e-8, 1e-10, 1 + 2**-11, 1 + 3 * 2**-11, 1 + 2**-8, 1 + 3 * 2**-8,
               3e38, 3.3895e38, 3.4e38, -3.4e38, float('inf'), float('-inf'), float('nan'), -float('nan')]
    scales = torch.pow(10.0, torch.empty(4000).uniform_(-9, 6))
    src = torch.cat([torch.tensor(special), torch.randn(4000) * scales])
    tensors['cvt_src'] = src
    tensors['cvt_f16'] = src.half()
    tensors['cvt_bf16'] = src.bfloat16()
    tensors['cvt_f16_wide'] = tensors['cvt_f16'].float()
    tensors['cvt_bf16_wide'] = tensors['cvt_bf16'].float()
    ints = torch.cat([torch.tensor([0, 1, -1, 127, 128, -129, 255, 256, 32767, 32768, -32769, 2**31, -2**31 - 1,
                                    2**40 + 5, -2**40 - 3]), torch.randint(-2**62, 2**62, (500,))])
    tensors['cvt_int_src'] = ints
    for name, dt in (('i8', torch.int8), ('i16', torch.int16), ('i32', torch.int32), ('u8', torch.uint8)):
        tensors[f'cvt_{name}'] = ints.to(dt)
        tensors[f'cvt_{name}_f16'] = tensors[f'cvt_{name}'].half()  # integer -> float16
    names = list(tensors)
    dtype_of = {v: k for k, v in TORCH.items()}
    blobs = {n: raw_bytes(t) for n, t in tensors.items()}
    # Data in reverse order of the header, as writers that sort by size or dtype produce.
    offsets, pos = {}, 0
    for n in reversed(names):
        offsets[n] = [pos, pos + len(blobs[n])]
        pos += len(blobs[n])
    header = {'__metadata__': {'format': 'pt', 'source': 'torch ' + torch.__version__}}
    for n in names:
        header[n] = {'dtype': dtype_of[tensors[n].dtype], 'shape': list(tensors[n].shape),
                     'data_offsets': offsets[n]}
    text = json.dumps(header).encode('utf-8')
    text += b' ' * ((8 - len(text) % 8) % 8)
    with open(f'{d}/torch.safetensors', 'wb') as f:
        f.write(struct.pack('<Q', len(text)))
        f.write(text)
        for n in reversed(names):
            f.write(blobs[n])

    os.makedirs(f'{d}/torch_raw', exist_ok=True)
    with open(f'{d}/torch_manifest.txt', 'w') as m:
        for n in names:
            t = tensors[n]
            shape = 'x'.join(str(s) for s in t.shape) if t.dim() else 'scalar'
            m.write(f'{n} {dtype_of[t.dtype]} {shape}\n')
            open(f'{d}/torch_raw/{n}.bin', 'wb').write(raw_bytes(t))
    print(f'wrote {len(names)} tensors from torch {torch.__version__}')


if __name__ == '__main__':
    read_mumoe(sys.argv[1])
    write_torch(sys.argv[1])
