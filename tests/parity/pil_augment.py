#!/usr/bin/python3
"""Pillow side of the RandAugment parity test (tests/test_rand_augment_parity.cpp).

Reads <dir>/manifest.txt in the layer_manifest.py format, one case per line:
NAME KIND KEY=VALUE... | ROLE=FILE:SHAPE... (files float32, row-major; a case may have no
files). Kinds:

  op      op=NAME magnitude=M fill=F      role: image (H x W x C, values 0..255, C = 1 or 3)
      One RandAugment operation as torchvision's _apply_op (0.14) applies it to a PIL image
      ("L" for C = 1, "RGB" for C = 3) with nearest-neighbour interpolation; writes NAME.out.
  chain   ops=NAME:M,NAME:M,... fill=F    role: image
      The operations in turn, each as above; writes NAME.out.
  table   bins=N height=H width=W         (no files)
      torchvision's RandAugment magnitude table for an H x W image, the 14 operations in
      its order, num_bins values each (0 for those without a magnitude); writes NAME.table
      (14 x N).
The operations are written out here from torchvision's definitions, calling the same PIL
functions with the same arguments; torchvision itself is not needed.
"""
import math
import sys

import numpy as np
import torch
from PIL import Image, ImageEnhance, ImageOps

OPS = ['Identity', 'ShearX', 'ShearY', 'TranslateX', 'TranslateY', 'Rotate', 'Brightness', 'Color', 'Contrast',
       'Sharpness', 'Posterize', 'Solarize', 'AutoContrast', 'Equalize']


def load_image(d, spec):
    name, shape = spec.split(':')
    h, w, c = [int(s) for s in shape.split('x')]
    arr = np.fromfile(f'{d}/{name}', dtype=np.float32).reshape(h, w, c)
    arr = np.rint(arr).astype(np.uint8)
    return Image.fromarray(arr[:, :, 0], 'L') if c == 1 else Image.fromarray(arr, 'RGB')


def save_image(d, name, img):
    arr = np.asarray(img, dtype=np.uint8)
    if arr.ndim == 2:
        arr = arr[:, :, None]
    arr.astype(np.float32).tofile(f'{d}/{name}.out.bin')


def inverse_affine_matrix(center, angle, translate, scale, shear):
    """torchvision.transforms.functional._get_inverse_affine_matrix (inverted=True)."""
    rot = math.radians(angle)
    sx = math.radians(shear[0])
    sy = math.radians(shear[1])
    cx, cy = center
    tx, ty = translate
    a = math.cos(rot - sy) / math.cos(sy)
    b = -math.cos(rot - sy) * math.tan(sx) / math.cos(sy) - math.sin(rot)
    c = math.sin(rot - sy) / math.cos(sy)
    d = -math.sin(rot - sy) * math.tan(sx) / math.cos(sy) + math.cos(rot)
    matrix = [d, -b, 0.0, -c, a, 0.0]
    matrix = [x / scale for x in matrix]
    matrix[2] += matrix[0] * (-cx - tx) + matrix[1] * (-cy - ty)
    matrix[5] += matrix[3] * (-cx - tx) + matrix[4] * (-cy - ty)
    matrix[2] += cx
    matrix[5] += cy
    return matrix


def fillcolor(img, fill):
    """torchvision's _parse_fill: one value per band."""
    return fill if len(img.getbands()) == 1 else tuple([fill] * len(img.getbands()))


def affine(img, angle, translate, scale, shear, fill, center=None):
    """torchvision's F.affine on a PIL image: the centre defaults to (W/2, H/2)."""
    width, height = img.size
    if center is None:
        center = [width * 0.5, height * 0.5]
    matrix = inverse_affine_matrix(center, angle, translate, scale, shear)
    return img.transform(img.size, Image.AFFINE, matrix, Image.NEAREST, fillcolor=fillcolor(img, fill))


def apply_op(img, op, m, fill):
    """torchvision.transforms.autoaugment._apply_op for PIL images."""
    if op == 'ShearX':
        return affine(img, 0.0, [0, 0], 1.0, [math.degrees(math.atan(m)), 0.0], fill, center=[0, 0])
    if op == 'ShearY':
        return affine(img, 0.0, [0, 0], 1.0, [0.0, math.degrees(math.atan(m))], fill, center=[0, 0])
    if op == 'TranslateX':
        return affine(img, 0.0, [int(m), 0], 1.0, [0.0, 0.0], fill)
    if op == 'TranslateY':
        return affine(img, 0.0, [0, int(m)], 1.0, [0.0, 0.0], fill)
    if op == 'Rotate':
        return img.rotate(m, Image.NEAREST, False, None, fillcolor=fillcolor(img, fill))
    if op == 'Brightness':
        return ImageEnhance.Brightness(img).enhance(1.0 + m)
    if op == 'Color':
        return ImageEnhance.Color(img).enhance(1.0 + m)
    if op == 'Contrast':
        return ImageEnhance.Contrast(img).enhance(1.0 + m)
    if op == 'Sharpness':
        return ImageEnhance.Sharpness(img).enhance(1.0 + m)
    if op == 'Posterize':
        return ImageOps.posterize(img, int(m))
    if op == 'Solarize':
        return ImageOps.solarize(img, m)
    if op == 'AutoContrast':
        return ImageOps.autocontrast(img)
    if op == 'Equalize':
        return ImageOps.equalize(img)
    if op == 'Identity':
        return img
    raise ValueError(f'unknown op {op}')


def run_op(d, name, args, files):
    img = load_image(d, files['image'])
    save_image(d, name, apply_op(img, args['op'], float(args['magnitude']), int(args['fill'])))


def run_chain(d, name, args, files):
    img = load_image(d, files['image'])
    for step in args['ops'].split(','):
        op, m = step.split(':')
        img = apply_op(img, op, float(m), int(args['fill']))
    save_image(d, name, img)


def run_table(d, name, args, files):
    """torchvision's RandAugment._augmentation_space(num_bins, (height, width))."""
    n, height, width = int(args['bins']), int(args['height']), int(args['width'])
    space = {
        'Identity': torch.tensor(0.0),
        'ShearX': torch.linspace(0.0, 0.3, n),
        'ShearY': torch.linspace(0.0, 0.3, n),
        'TranslateX': torch.linspace(0.0, 150.0 / 331.0 * width, n),
        'TranslateY': torch.linspace(0.0, 150.0 / 331.0 * height, n),
        'Rotate': torch.linspace(0.0, 30.0, n),
        'Brightness': torch.linspace(0.0, 0.9, n),
        'Color': torch.linspace(0.0, 0.9, n),
        'Contrast': torch.linspace(0.0, 0.9, n),
        'Sharpness': torch.linspace(0.0, 0.9, n),
        'Posterize': 8 - (torch.arange(n) / ((n - 1) / 4)).round().int(),
        'Solarize': torch.linspace(255.0, 0.0, n),
        'AutoContrast': torch.tensor(0.0),
        'Equalize': torch.tensor(0.0),
    }
    rows = []
    for op in OPS:
        m = space[op]
        rows.append([float(m[i].item()) if m.ndim > 0 else 0.0 for i in range(n)])
    np.array(rows, dtype=np.float32).tofile(f'{d}/{name}.table.bin')


KINDS = {'op': run_op, 'chain': run_chain, 'table': run_table}


def main(d):
    torch.set_num_threads(1)
    # layer_manifest.run_manifest's loop, where the part after '|' may be empty.
    for line in open(f'{d}/manifest.txt'):
        head, _, tail = line.strip().partition('|')
        name, kind, *args = head.split()
        args = dict(a.split('=', 1) for a in args)
        files = dict(f.split('=', 1) for f in tail.split())
        KINDS[kind](d, name, args, files)


if __name__ == '__main__':
    main(sys.argv[1])
