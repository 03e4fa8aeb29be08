"""How long `mdot probe` and `mdot adapt --probe` take on this machine from nothing (goals:
<= 5 and <= 10 minutes on 2 cores). Measures: run it with nothing else on the machine.

    python benchmarks/bench_probe.py --out benchmarks/results/probe-time

Both run as a user runs them, into fresh temporary folders (the device's own data folder is
not read, so nothing is reused): `mdot probe`, then `mdot adapt --probe` with its default
budget (the probe again, then more core-set samples while the budget lasts, then the fit).
The wall times are appended to `<out>/results.jsonl`, one line per run, with the device slug.
"""

from __future__ import annotations

import argparse
import datetime
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

LIMITS_S = {"probe": 300, "adapt": 600}


def _timed(args: list[str]) -> tuple[float, list[str]]:
    t0 = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "mdot_jax.cli", *args], capture_output=True,
                          text=True)
    if done.returncode:
        said = (done.stdout + done.stderr).strip().splitlines()[-3:]
        raise SystemExit(f"mdot {' '.join(args)} failed (exit code {done.returncode}): "
                         + " / ".join(said))
    return time.perf_counter() - t0, done.stdout.strip().splitlines()[-3:]


def main() -> None:
    from mdot_jax.measure.device import device_slug, fingerprint

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()
    slug = device_slug(fingerprint(args.threads))
    with tempfile.TemporaryDirectory() as tmp:
        probe_s, _ = _timed(["probe", "--out", f"{tmp}/probe", "--threads", str(args.threads)])
        adapt_s, said = _timed(["adapt", "--probe", "--data", f"{tmp}/adapt", "--out",
                                f"{tmp}/ck", "--threads", str(args.threads)])
    row = dict(date=datetime.date.today().isoformat(), device=slug, threads=args.threads,
               probe_s=round(probe_s, 1), adapt_s=round(adapt_s, 1), adapt_said=said,
               within_limits=probe_s <= LIMITS_S["probe"] and adapt_s <= LIMITS_S["adapt"])
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "results.jsonl", "a") as f:
        f.write(json.dumps(row) + "\n")
    print(json.dumps(row, indent=1))


if __name__ == "__main__":
    main()
