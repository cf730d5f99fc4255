#!/usr/bin/env python3
"""Checks what a reproduction program's smoke run left in its output directory: each named
JSON file parses and holds the program's name and scale, and each named PNG opens as an
image (matplotlib reads it) of nonzero size. Exit status 1 with the reason otherwise.

    check_repro.py [--scale SCALE] DIR PROGRAM FILE...      (SCALE: smoke by default)
"""
import json
import os
import sys


def main():
    args = sys.argv[1:]
    scale = "smoke"
    if args[:1] == ["--scale"]:
        scale, args = args[1], args[2:]
    out_dir, program, files = args[0], args[1], args[2:]
    for name in files:
        path = os.path.join(out_dir, name)
        if not os.path.isfile(path):
            sys.exit(f"{program}: {path} was not written")
        if name.endswith(".json"):
            with open(path) as f:
                data = json.load(f)
            if data.get("program") != program or data.get("scale") != scale:
                sys.exit(f"{path}: program/scale are {data.get('program')!r}/{data.get('scale')!r}")
        elif name.endswith(".png"):
            with open(path, "rb") as f:
                if f.read(8) != b"\x89PNG\r\n\x1a\n":
                    sys.exit(f"{path}: not a PNG file")
            import matplotlib
            matplotlib.use("Agg")
            import matplotlib.image
            image = matplotlib.image.imread(path)
            if image.shape[0] == 0 or image.shape[1] == 0:
                sys.exit(f"{path}: an empty image")
    # No temporaries of the atomic writes left behind.
    left = [n for n in os.listdir(out_dir) if ".tmp." in n]
    if left:
        sys.exit(f"{program}: temporaries left in {out_dir}: {left}")
    print(f"{program}: {', '.join(files)} ok")


main()
