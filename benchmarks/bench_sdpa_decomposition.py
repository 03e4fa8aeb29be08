"""What an SDPA call runs: the exporter's decomposition inside the fused block, adopted or not
(docs/studies/sdpa-decomposition.md, where the rule is).

    python benchmarks/bench_sdpa_decomposition.py --out benchmarks/results/sdpa-decomposition

The status quo is the same code with `converters.attention.decomposed` held empty: the scale
and the causal mask priced as kernels of their own.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from unittest import mock

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from bench_llm_mfu import GPUS, mfu_rows  # noqa: E402
from bench_llm_steps import price, summarize  # noqa: E402

STEPS = Path("data/gpu-nvidia-h200/llm-steps.jsonl")


def scored() -> dict:
    """The H200's LLM steps and the MFU table, priced by the code as it stands."""
    steps = [json.loads(x) for x in STEPS.read_text().splitlines() if x.strip()]
    priced = price(steps)[0]
    flash = [r for r in priced if r["attention"] == "flash"]
    mfu = mfu_rows(GPUS)
    return dict(rows=priced, summary=summarize(priced),
                flash_mape=100 * float(np.mean([abs(r["predicted_ms"] / r["measured_ms"] - 1)
                                                for r in flash])),
                mfu=[r["mfu"] for r in mfu],
                mfu_in_25_65=sum(0.25 <= r["mfu"] <= 0.65 for r in mfu if r["memory_gb"] <= 80))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    with mock.patch("mdot_jax.gpu.spec_sheet.decomposed", lambda seq, block: ()):
        status_quo = scored()
    candidate = scored()
    for a, b in zip(status_quo["rows"], candidate["rows"]):
        if a["attention"] == "eager":
            assert a["predicted_ms"] == b["predicted_ms"], a["key"]
    results = dict(status_quo=status_quo, candidate=candidate,
                   adopted=candidate["flash_mape"] <= status_quo["flash_mape"] + 1.0)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    print(json.dumps({k: dict(flash_mape=v["flash_mape"], mfu_in_25_65=v["mfu_in_25_65"])
                      for k, v in results.items() if isinstance(v, dict)}
                     | dict(adopted=results["adopted"]), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
