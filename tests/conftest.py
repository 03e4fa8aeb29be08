"""Test set-up: every cache goes to a temporary folder, so tests leave nothing behind."""

import os
import tempfile

_TMP = tempfile.mkdtemp(prefix="mdot-tests-")
for var in ("HOME", "XDG_CACHE_HOME", "TORCH_HOME", "HF_HOME", "MPLCONFIGDIR"):
    os.environ[var] = os.path.join(_TMP, var.lower())
    os.makedirs(os.environ[var], exist_ok=True)
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ.setdefault("JAX_PLATFORMS", "cpu")


import pytest  # noqa: E402
from timm_rows import TINY_ARCHS, timm_csvs  # noqa: E402


@pytest.fixture(scope="session")
def tiny_real_dataset(tmp_path_factory):
    """A real dataset: 12 small timm architectures x 2 layouts with their measured RTX 3090
    step times (timm's published rows), built by the timm builder."""
    pytest.importorskip("timm")
    from mdot_jax.data.build_timm import build_timm
    from mdot_jax.data.dataset import load_dataset

    csvs = timm_csvs(tmp_path_factory.mktemp("tiny-timm-csv"), TINY_ARCHS)
    root = tmp_path_factory.mktemp("tiny-timm")
    build_timm(csvs, root, models=TINY_ARCHS, progress=False)
    return load_dataset(root)
