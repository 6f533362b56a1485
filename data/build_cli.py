"""The command line every data builder shares (``data/demo/build.py``, ``data/hops/build.py``).

``--shared`` (the project's shared data folder) and ``--out`` (default: the builder's own folder); prints one line
per written file: name, rows, bytes, sha256 (what the folder's README lists). Standard library only.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

Build = Callable[[Path, Path], dict[str, tuple[int, str]]]


def run(build: Build, description: str, folder: Path, argv: list[str] | None = None) -> int:
    """Parse ``argv``, call ``build(shared, out)`` and print what it wrote; returns the exit status."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--shared", type=Path, default=Path("../shared/data"), help="the shared data folder")
    ap.add_argument("--out", type=Path, default=folder, help="output folder")
    args = ap.parse_args(argv)
    for name, (rows, digest) in build(args.shared, args.out).items():
        print(f"{name}\t{rows}\t{(args.out / name).stat().st_size}\t{digest}")
    return 0
