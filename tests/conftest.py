"""Test set-up: every cache goes to a temporary folder, so tests leave nothing behind."""

import gc
import os
import pathlib
import shutil
import tempfile

_TMP = tempfile.mkdtemp(prefix="mdot-tests-")
for var in ("HOME", "XDG_CACHE_HOME", "TORCH_HOME", "HF_HOME", "MPLCONFIGDIR"):
    os.environ[var] = os.path.join(_TMP, var.lower())
    os.makedirs(os.environ[var], exist_ok=True)
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["MDOT_EXPORTS"] = "off"  # each test exports what it asks (a test of the cache: its own)
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# a step compiled once is not compiled again by the next test that trains the same shapes
os.environ["JAX_COMPILATION_CACHE_DIR"] = os.path.join(_TMP, "jax-cache")
os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0.5"


import pytest  # noqa: E402
from timm_rows import TINY_ARCHS, timm_csvs  # noqa: E402

TINY = pathlib.Path(__file__).parent / "data" / "tiny-timm"  # made by its make.py


@pytest.fixture(scope="session")
def tiny_real_dataset(tmp_path_factory):
    """A real dataset, committed (`data/tiny-timm`): 12 small timm architectures x 2 layouts
    with their measured RTX 3090 step times (timm's published rows), sequences packed, no
    exports; a copy, so a test cannot change the committed one. Needs no torch or timm."""
    from mdot_jax.data.dataset import load_dataset

    root = tmp_path_factory.mktemp("tiny") / "tiny-timm"
    shutil.copytree(TINY, root, ignore=shutil.ignore_patterns("make.py"))
    return load_dataset(root)


@pytest.fixture(scope="session")
def trained(tiny_real_dataset):
    """A tiny MDOT network trained for two epochs on `tiny_real_dataset`: what the model,
    training, checkpoint and prediction tests share (trained once per session)."""
    from mdot_jax.models import tiny_config
    from mdot_jax.training.train import TrainConfig, train

    cfg = TrainConfig(epochs=2, tokens_per_batch=2048, val_fraction=0.2)
    return train(tiny_real_dataset.samples, tiny_config(0), cfg, progress=False)


@pytest.fixture(scope="session")
def tiny_timm_build(tmp_path_factory):
    """The same dataset built here by the timm builder, with its ONNX exports (`onnx/`)."""
    pytest.importorskip("timm")
    from mdot_jax.data.build_timm import build_timm
    from mdot_jax.data.dataset import load_dataset

    csvs = timm_csvs(tmp_path_factory.mktemp("tiny-timm-csv"), TINY_ARCHS)
    root = tmp_path_factory.mktemp("tiny-timm")
    build_timm(csvs, root, models=TINY_ARCHS, progress=False)
    return load_dataset(root)


@pytest.fixture(scope="session")
def small_models(tmp_path_factory):
    """A model dataset measured here: a small CNN (MobileNetV3-small, 32 px) and a small
    transformer (BERT-tiny, 16 tokens) at batch 2; their graphs hold ~60 distinct operator
    rows of 20 types, small enough to measure in seconds."""
    pytest.importorskip("torchvision")
    pytest.importorskip("transformers")
    from mdot_jax.measure.profiler import Protocol, profile

    fast = Protocol(warmup=1, repeats=3, max_iter_s=30.0, budget_s=10.0, max_cv=float("inf"),
                    max_others=float("inf"))
    out = tmp_path_factory.mktemp("models")
    profile(["torchvision"], [2], [32], out, threads=1, progress=False,
            models=["mobilenet_v3_small"], protocol=fast, speed_check=False)
    profile(["hf"], [2], [16], out, threads=1, progress=False, models=["bert-tiny"],
            protocol=fast, speed_check=False)
    return out


@pytest.fixture
def quiet_protocol():
    """A measurement protocol for tiny models in tests: their timing noise (and a busy test
    machine) must not send the samples to noisy.jsonl."""
    from mdot_jax.measure.profiler import Protocol

    return Protocol(warmup=1, repeats=3, max_iter_s=30.0, budget_s=10.0, max_cv=float("inf"),
                    max_others=float("inf"))


def _export_here(argv: list[str]) -> tuple[int, str]:
    """`model_source._export_child` in this process (PyTorch and transformers are imported
    here already; a child re-imports them, seconds a config): its exit status and stderr."""
    import contextlib
    import io

    from converters.hf_config import _main

    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            return _main(argv), err.getvalue()
    except Exception as e:  # as a child dies: its traceback's last line
        return 1, f"{type(e).__name__}: {e}"


@pytest.fixture(autouse=True)
def _configs_export_in_process(request, monkeypatch):
    """Hugging Face configs export in the test's process, but where a test is marked
    `child_export` (the child process itself under test)."""
    if "child_export" not in request.keywords:
        from mdot_jax.serving import model_source

        monkeypatch.setattr(model_source, "_export_child", _export_here)


def pytest_collection_finish(session):
    """What collection imported (torch, transformers, JAX: most of a worker's objects) lives
    for the whole session: frozen, the cycle collector stops walking it, and runs 30x less
    often than Python's default (every 700 allocations)."""
    gc.freeze()
    gc.set_threshold(20_000, 20, 20)
