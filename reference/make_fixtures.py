#!/usr/bin/env python3
"""Writes every golden under tests/fixtures/ with the reference libraries.

Each module in reference/goldens/ exposes make(fixtures_dir: pathlib.Path) and writes its own
subfolder. Output is deterministic: fixed seeds, one thread, sorted keys.
Usage: python reference/make_fixtures.py [--only NAME ...]
"""
import argparse
import hashlib
import importlib
import os
import pathlib
import shutil
import sys

HERE = pathlib.Path(__file__).resolve().parent
FIXTURES = HERE.parent / "tests" / "fixtures"


DEDUPE_MIN_BYTES = 64 * 1024


def materialize_links(root: pathlib.Path) -> None:
    """Replaces every symlink under root by a copy of its target, so modules write real files."""
    for path in sorted(root.rglob("*")):
        if path.is_symlink():
            target = path.resolve()
            path.unlink()
            shutil.copyfile(target, path)


def dedupe(root: pathlib.Path) -> int:
    """Replaces files identical to an earlier one (sorted path order) by relative symlinks.

    The tiny pipelines share tokenizer vocabularies and text encoders; storing each once keeps
    the fixtures within their size budget. Returns the bytes saved."""
    first_by_digest, saved = {}, 0
    for path in sorted(p for p in root.rglob("*") if p.is_file() and not p.is_symlink()):
        if path.stat().st_size < DEDUPE_MIN_BYTES:
            continue
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        if digest not in first_by_digest:
            first_by_digest[digest] = path
            continue
        saved += path.stat().st_size
        path.unlink()
        path.symlink_to(os.path.relpath(first_by_digest[digest], path.parent))
    return saved


def main() -> int:
    import torch

    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--only", nargs="*", help="golden modules to run (default: all)")
    args = parser.parse_args()
    sys.path.insert(0, str(HERE))
    names = sorted(p.stem for p in (HERE / "goldens").glob("*.py") if not p.stem.startswith("_"))
    materialize_links(FIXTURES)
    for name in args.only or names:
        if name not in names:
            print(f"unknown golden module '{name}'; known: {', '.join(names)}", file=sys.stderr)
            return 2
        print(f"[make_fixtures] {name}", flush=True)
        importlib.import_module(f"goldens.{name}").make(FIXTURES)
    print(f"[make_fixtures] deduplicated {dedupe(FIXTURES)} bytes into symlinks", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
