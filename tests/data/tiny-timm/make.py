"""Builds the committed tiny dataset the model, training and evaluation tests read: the
12 small timm architectures of `tests/timm_rows.py` in both layouts, with timm's published
RTX 3090 training step times, built by the timm builder, its sequences packed, its ONNX
exports left out (`tiny_timm_build` in conftest.py builds them where a test needs them).

    python tests/data/tiny-timm/make.py      # needs timm; replaces this folder's dataset

Run it when the operator sequences are meant to change (a converter or timm upgrade)."""

import shutil
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE.parents[1]))  # tests/: timm_rows


def main() -> None:
    from timm_rows import TINY_ARCHS, timm_csvs

    from mdot_jax.data.build_timm import build_timm
    from mdot_jax.data.dataset import PACKED_SEQS, REPORT, SAMPLES
    from mdot_jax.data.store import pack_sequences

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "tiny-timm"
        build_timm(timm_csvs(Path(tmp) / "csv", TINY_ARCHS), root, models=TINY_ARCHS)
        pack_sequences(root)
        for name in (SAMPLES, PACKED_SEQS, REPORT):
            shutil.copy(root / name, HERE / name)


if __name__ == "__main__":
    main()
