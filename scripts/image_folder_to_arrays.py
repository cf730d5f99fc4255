#!/usr/bin/python3
"""Converts an image dataset stored as one folder per class (ImageNet's train/ and val/ as
most copies lay them out: <split>/<class>/<image>.JPEG) into the image-array layout that
train_mixer --image-arrays and repro_table3_mixer --scale paper read (data/image_arrays.h):

    OUT/meta.json, OUT/<split>.images (uint8 N x S x S x 3), OUT/<split>.labels (uint16 N)

Each image is decoded with Pillow (Debian: python3-pil), converted to RGB, resized so that
its shorter side is S (bicubic, with Pillow's antialiasing) and cut to its central S x S
square. Class ids are the class folders' names in sorted order; a second split must have
the same class folders. The arrays are written to temporary files and renamed at the end,
and meta.json is rewritten last, so an interrupted conversion leaves nothing half-written
under a final name.

    scripts/image_folder_to_arrays.py --src /data/imagenet/train --split train --out imagenet-256 --size 256
    scripts/image_folder_to_arrays.py --src /data/imagenet/val   --split val   --out imagenet-256 --size 256
"""
import argparse
import json
import os
import sys
from multiprocessing import Pool

import numpy as np
from PIL import Image

EXTENSIONS = {'.jpg', '.jpeg', '.png', '.bmp', '.ppm', '.tif', '.tiff', '.webp'}


def list_images(src):
    classes = sorted(d for d in os.listdir(src) if os.path.isdir(os.path.join(src, d)))
    if not classes:
        sys.exit(f'{src}: no class folders')
    items = []
    for label, name in enumerate(classes):
        folder = os.path.join(src, name)
        for f in sorted(os.listdir(folder)):
            if os.path.splitext(f)[1].lower() in EXTENSIONS:
                items.append((os.path.join(folder, f), label))
    return classes, items


def load(args):
    path, size = args
    try:
        with Image.open(path) as im:
            im = im.convert('RGB')
            w, h = im.size
            scale = size / min(w, h)
            nw, nh = max(size, round(w * scale)), max(size, round(h * scale))
            im = im.resize((nw, nh), Image.BICUBIC)
            left, top = (nw - size) // 2, (nh - size) // 2
            return np.asarray(im.crop((left, top, left + size, top + size)), dtype=np.uint8).tobytes()
    except Exception as e:  # a damaged file is named, not skipped silently
        raise RuntimeError(f'{path}: {e}') from e


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument('--src', required=True, help='folder holding one folder of images per class')
    ap.add_argument('--split', required=True, help='split name: letters, digits, - and _ (train, val)')
    ap.add_argument('--out', required=True, help='output directory (created)')
    ap.add_argument('--size', type=int, default=256, help='side S of the stored square images')
    ap.add_argument('--workers', type=int, default=os.cpu_count(), help='decoding processes')
    a = ap.parse_args()
    if not a.split.replace('-', '').replace('_', '').isalnum():
        sys.exit(f'--split {a.split!r}: letters, digits, - and _ only')
    classes, items = list_images(a.src)
    if len(classes) > 65536:
        sys.exit(f'{a.src}: {len(classes)} classes; labels are uint16 (at most 65536)')
    os.makedirs(a.out, exist_ok=True)
    meta_path = os.path.join(a.out, 'meta.json')
    meta = {'format': 'mumoe-image-arrays', 'version': 1, 'height': a.size, 'width': a.size, 'channels': 3,
            'classes': len(classes), 'splits': {}, 'class_names': classes}
    if os.path.exists(meta_path):
        with open(meta_path) as f:
            old = json.load(f)
        for k in ('height', 'width', 'channels', 'classes'):
            if old.get(k) != meta[k]:
                sys.exit(f'{meta_path}: {k} is {old.get(k)}, this split has {meta[k]}')
        if old.get('class_names', classes) != classes:
            sys.exit(f'{meta_path}: the class folders of {a.src} differ from the recorded class_names')
        meta['splits'] = old.get('splits', {})
    images = os.path.join(a.out, f'{a.split}.images')
    labels = os.path.join(a.out, f'{a.split}.labels')
    tmp = f'.tmp.{os.getpid()}'
    with open(images + tmp, 'wb') as out, Pool(a.workers) as pool:
        for i, data in enumerate(pool.imap(load, ((p, a.size) for p, _ in items), chunksize=64)):
            out.write(data)
            if (i + 1) % 10000 == 0:
                print(f'{i + 1} / {len(items)} images', flush=True)
        out.flush()
        os.fsync(out.fileno())
    with open(labels + tmp, 'wb') as out:
        out.write(np.asarray([l for _, l in items], dtype='<u2').tobytes())
        out.flush()
        os.fsync(out.fileno())
    os.replace(images + tmp, images)
    os.replace(labels + tmp, labels)
    meta['splits'][a.split] = len(items)
    with open(meta_path + tmp, 'w') as f:
        json.dump(meta, f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    os.replace(meta_path + tmp, meta_path)
    print(f'{a.split}: {len(items)} images of {a.size}x{a.size}x3 in {len(classes)} classes -> {a.out}')


if __name__ == '__main__':
    main()
