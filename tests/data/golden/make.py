"""Records what the shipped checkpoints predict for ten committed operator sequences, so that
a refactoring can be checked to predict exactly as before (`test_shipped_checkpoints.py`).

    python tests/data/golden/make.py SRC_DATASET   # copies the sequences once, then records

Run it only when a prediction is meant to change (a retrained checkpoint), and say so."""

import json
import sys
from pathlib import Path

HERE = Path(__file__).parent
ARCHS = ("resnet18", "mobilenetv3_large_100", "vit_tiny_patch16_224", "convnext_atto",
         "efficientnet_b0", "densenet121", "bert-mini", "gpt2-tiny", "regnety_008",
         "mixer_s16_224")
BATCH = 16


def main() -> None:
    from converters import OperatorSequence
    from mdot_jax.data.dataset import load_sequence, read_samples
    from mdot_jax.serving.predict import CHECKPOINT_DIR, Predictor

    if len(sys.argv) > 1:  # copy the batch-16 sequences of a fused dataset
        src = Path(sys.argv[1])
        rows = read_samples(src / "samples.jsonl")[0]  # packed or not
        for arch in ARCHS:
            row = next(r for r in rows if r["arch"] == arch
                       and r["workload"]["batch_size"] == BATCH)
            load_sequence(src, row["seq"]).save(HERE / f"{arch}.npz")
    out = {}
    shipped = sorted(p.name for p in CHECKPOINT_DIR.glob("*") if (p / "metadata.json").exists())
    for name in shipped:
        p = Predictor.load(name)
        for arch in ARCHS:
            seq = OperatorSequence.load_npz(HERE / f"{arch}.npz")
            pred = p.predict(seq, batch_size=BATCH)
            out[f"{name}/{arch}"] = dict(iteration_ms=pred.iteration_ms,
                                         interval_ms=list(pred.interval_ms or ()))
    (HERE / "predictions.json").write_text(json.dumps(out, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
