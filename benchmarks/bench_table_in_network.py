"""What an embedding table costs inside a network: a text model's training iteration with
its word table trainable, then frozen, alternated four times in one process (so that a slow
spell of the machine hits both), at 32 tokens and batch 2; the difference of the medians is
the table's gradient and update. Measures: run it alone on the machine.

    python benchmarks/bench_table_in_network.py roberta-small bloom-small bert-small gpt2-mini
"""

from __future__ import annotations

import argparse
import json

import numpy as np

from converters.export import from_torch
from mdot_jax.data.profile import ZOOS, Protocol, _inputs, measure_step


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("models", nargs="+", help="text models of the zoo (mdot_jax/data/profile.py)")
    p.add_argument("--rounds", type=int, default=4)
    args = p.parse_args()
    import torch

    torch.set_num_threads(2)
    zoo = {m.name: m for m in ZOOS["hf"]()}
    proto = Protocol(warmup=2, repeats=5, max_iter_s=30.0, budget_s=30.0)
    out = {}
    for name in args.models:
        m = zoo[name]
        model = m.build(32)
        x, target = _inputs(m, 32, 2, "cpu", torch)
        from_torch(model, x, input_names=["input_ids"])  # as `mdot profile` does before timing
        table = model.model.get_input_embeddings().weight
        times: dict[bool, list[float]] = {True: [], False: []}
        for _ in range(args.rounds):
            for trainable in (True, False):
                table.requires_grad_(trainable)
                times[trainable] += measure_step(model, x, target, proto, "cpu")
        on, off = float(np.median(times[True])), float(np.median(times[False]))
        out[name] = dict(table=list(table.shape), trainable_ms=on, frozen_ms=off,
                         table_ms=on - off)
        print(json.dumps({name: out[name]}), flush=True)


if __name__ == "__main__":
    main()
