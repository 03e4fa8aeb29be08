"""Test set-up: every cache goes to a temporary folder, so tests leave nothing behind."""

import os
import tempfile

_TMP = tempfile.mkdtemp(prefix="mdot-tests-")
for var in ("HOME", "XDG_CACHE_HOME", "TORCH_HOME", "HF_HOME", "MPLCONFIGDIR"):
    os.environ[var] = os.path.join(_TMP, var.lower())
    os.makedirs(os.environ[var], exist_ok=True)
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import pathlib  # noqa: E402

import pytest  # noqa: E402

SHARED_TIMM = pathlib.Path(__file__).resolve().parents[2] / "shared" / "datasets" / "timm-rtx3090"
TINY_ARCHS = ["dla46x_c", "mobilevit_xxs", "dla46_c", "edgenext_xx_small", "mobilevitv2_050",
              "mobilenetv3_small_050", "lcnet_035", "mobilenetv2_035", "lcnet_050",
              "mnasnet_small", "mobilenetv2_050", "ese_vovnet19b_slim_dw"]


@pytest.fixture(scope="session")
def tiny_real_dataset(tmp_path_factory):
    """A real dataset: 12 small timm architectures x 2 layouts with their measured RTX 3090
    step times, built by the timm builder from ../shared/datasets (skipped when absent)."""
    pytest.importorskip("timm")
    csvs = sorted(SHARED_TIMM.glob("benchmark-train-*.csv"))
    if not csvs:
        pytest.skip("shared/datasets/timm-rtx3090 not present")
    from mdot_jax.build_timm import build_timm
    from mdot_jax.data import load_dataset

    root = tmp_path_factory.mktemp("tiny-timm")
    build_timm(csvs, root, models=TINY_ARCHS, progress=False)
    return load_dataset(root)
