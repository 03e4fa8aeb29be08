"""The command line of a kit step that measures planned rows into a JSON-lines file: appended
as measured, resumed by key, bounded in time (`main`), ended without the interpreter's
teardown (`finish`)."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn


def main(argv: list[str] | None, description: str, plan: Callable[[bool], list[dict]],
         measure: Callable[[dict, str], dict]) -> int:
    """`OUT.jsonl [--seconds S] [--dry-run] [--keys-with TEXT]`: every row of `plan(dry_run)`
    (whose key holds TEXT) not in OUT yet, measured on the GPU (on the CPU with `--dry-run` or
    without one) and appended with the device and PyTorch; no row starts after S seconds."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("out", type=Path)
    ap.add_argument("--seconds", type=float, default=120.0)
    ap.add_argument("--dry-run", action="store_true")
    ap.add_argument("--keys-with", default="", metavar="TEXT",
                    help="only the rows whose keys hold it")
    args = ap.parse_args(argv)
    import torch

    device = "cuda" if torch.cuda.is_available() and not args.dry_run else "cpu"
    name = torch.cuda.get_device_name() if device == "cuda" else "cpu"
    done = set()
    if args.out.exists():
        done = {json.loads(x)["key"] for x in args.out.read_text().splitlines() if x.strip()}
    start, n = time.perf_counter(), 0
    try:
        with open(args.out, "a") as f:
            for row in plan(args.dry_run):
                if row["key"] in done or args.keys_with not in row["key"]:
                    continue
                got = dict(measure(row, device), device=name, torch=torch.__version__)
                if device == "cuda":  # what `measure` allocated is gone with it
                    torch.cuda.empty_cache()
                f.write(json.dumps(got) + "\n")
                f.flush()
                n += 1
                if time.perf_counter() - start > args.seconds:
                    break
    except KeyboardInterrupt:  # the kit's `timeout -s INT`: the rows written are kept
        print(f"{args.out.name}: interrupted in a row; {n} measured, {len(done)} there before "
              "(a second run resumes)", file=sys.stderr)
        return 130
    print(f"{args.out.name}: {n} measured, {len(done)} there before", file=sys.stderr)
    return 0


def finish(code: int) -> NoReturn:
    """End the step's process with `code` once its output is flushed, skipping the
    interpreter's teardown: after torch.compile or transformers it can take seconds, into
    the kit's time limit, whose interrupt then lands in a finaliser as a traceback."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
