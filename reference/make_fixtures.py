#!/usr/bin/env python3
"""Writes every golden under tests/fixtures/ with the reference libraries.

Each module in reference/goldens/ exposes make(fixtures_dir: pathlib.Path) and writes its own
subfolder. Output is deterministic: fixed seeds, one thread, sorted keys.
Usage: python reference/make_fixtures.py [--only NAME ...]
"""
import argparse
import importlib
import pathlib
import sys

HERE = pathlib.Path(__file__).resolve().parent
FIXTURES = HERE.parent / "tests" / "fixtures"


def main() -> int:
    import torch

    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--only", nargs="*", help="golden modules to run (default: all)")
    args = parser.parse_args()
    sys.path.insert(0, str(HERE))
    names = sorted(p.stem for p in (HERE / "goldens").glob("*.py") if not p.stem.startswith("_"))
    for name in args.only or names:
        if name not in names:
            print(f"unknown golden module '{name}'; known: {', '.join(names)}", file=sys.stderr)
            return 2
        print(f"[make_fixtures] {name}", flush=True)
        importlib.import_module(f"goldens.{name}").make(FIXTURES)
    return 0


if __name__ == "__main__":
    sys.exit(main())
