"""Operator profiler: rows of real graphs build as PyTorch operators of the same size, the plan
covers every type, a killed run loses nothing finished, a foreign device is refused."""

import json
import math
import os
import signal
import subprocess
import sys
import time

import pytest

pytest.importorskip("torchvision")
import torch  # noqa: E402

from converters.sequence import CONFIG_FIELDS  # noqa: E402
from mdot_jax.errors import DatasetError  # noqa: E402
from mdot_jax.kernels.op_profile import (  # noqa: E402
    OpProtocol,
    harvest,
    measure_op,
    plan,
    plan_more,
    profile_ops,
    read_op_samples,
    read_plan,
)
from mdot_jax.kernels.specs import LOSS, MEASURED, OpSpec, build, grad_flow, loss_spec  # noqa: E402
from mdot_jax.measure.device import fingerprint  # noqa: E402

FAST_OPS = OpProtocol(warmup=1, repeats=3, side_repeats=1, min_repeat_ms=0.2,
                      max_spread=float("inf"), max_others=float("inf"))
# ops whose output the row fixes exactly (a Conv with asymmetric padding would not; these
# graphs have none)
_EXACT = {"Conv", "Gemm", "MatMul", "BatchNormalization", "LayerNormalization", "Softmax",
          "GlobalAveragePool", "Relu", "HardSwish", "Add", "Mul", "Gelu", "Concat", "Reshape"}


def test_harvest_reads_a_packed_dataset_as_its_files(small_models, tmp_path):
    """A committed dataset keeps its sequences in `seqs.tar.xz`, not as files."""
    import shutil

    from mdot_jax.data.dataset import clear_sequence_cache
    from mdot_jax.data.store import pack_sequences

    packed = tmp_path / "packed"
    shutil.copytree(small_models, packed)
    pack_sequences(packed, progress=False)
    clear_sequence_cache()
    assert not list((packed / "seqs").glob("*.npz"))
    assert ([s.key for s in harvest([packed], progress=False).specs]
            == [s.key for s in harvest([small_models], progress=False).specs])


def test_rows_of_real_graphs_build_as_operators_of_the_same_size(small_models):
    h = harvest([small_models], progress=False)
    types = {s.op_type for s in h.specs}
    assert {"Conv", "BatchNormalization", "MatMul", "LayerNormalization", "Softmax",
            "Gather", "Add"} <= types
    built = set()
    for spec in h.specs:
        if spec.op_type not in MEASURED:
            continue
        case = build(spec, torch)
        out = case.forward()
        outs = out if isinstance(out, (tuple, list)) else [out]
        if spec.op_type in _EXACT:
            assert sum(o.numel() for o in outs) == spec.c["out_numel"], spec
        if case.leaves:  # backward runs, and reaches every leaf that takes a gradient
            torch.autograd.backward([o for o in outs if o.requires_grad],
                                    [torch.ones_like(o) for o in outs if o.requires_grad])
            assert all(t.grad is not None for t in case.params), spec
        built.add(spec.op_type)
    assert {"Conv", "MatMul", "Softmax", "LayerNormalization"} <= built
    assert h.count[h.specs.index(next(s for s in h.specs if s.op_type == "Conv"))] >= 1


def test_backward_does_not_reach_the_graph_inputs():
    """A stem convolution computes its weight gradient only: the row says so."""
    from converters import convert, from_torch

    net = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.ReLU(), torch.nn.Conv2d(8, 8, 3))
    seq = convert(from_torch(net, torch.randn(2, 3, 16, 16)), batch_size=2)
    assert grad_flow(seq).tolist() == [False, True, True]
    stem = build(OpSpec("Conv", tuple(seq.config[0]), tuple(seq.load[0]), False), torch)
    assert len(stem.leaves) == len(stem.params) == 2  # weight and bias, not the input


def test_the_plan_covers_every_type_evenly_and_is_seeded(small_models):
    h = harvest([small_models], progress=False)
    a, b = plan(h, 60, seed=1, min_per_type=2), plan(h, 60, seed=1, min_per_type=2)
    assert a == b and a != plan(h, 60, seed=2, min_per_type=2)
    measured = {s.op_type for s in h.specs if s.op_type in MEASURED}
    assert {d["spec"]["op_type"] for d in a} == measured | {LOSS}
    keys = [OpSpec.from_json(d["spec"]).key for d in a]
    assert len(keys) == len(set(keys))
    # every type gets its minimum (or all its rows); the rest follows rows and load
    for t in measured:
        rows = sum(s.op_type == t for s in h.specs)
        assert sum(d["spec"]["op_type"] == t for d in a) >= min(2, rows)


def test_a_plan_grows_by_the_kinds_asked_for_once(small_models, tmp_path):
    """`--ops-more N --ops-kinds K`: up to N rows of those kinds that the plan lacks, added
    once (the same command again resumes it), a kind without rows refused by name."""
    h = harvest([small_models], progress=False)
    base = plan(h, 30, seed=0, min_per_type=1)
    kinds = ["Conv:depthwise", "Add"]
    more = plan_more(h, base, 10, kinds)
    have = {OpSpec.from_json(d["spec"]).key for d in base}
    keys = [OpSpec.from_json(d["spec"]).key for d in more]
    assert 0 < len(more) <= 10 and len(set(keys)) == len(keys) and not have & set(keys)
    assert {OpSpec.from_json(d["spec"]).kind for d in more} == set(kinds)
    with pytest.raises(ValueError, match="no measurable operator rows of Conv:nonsense"):
        plan_more(h, base, 10, ["Conv:nonsense"])

    tables = plan_more(h, base, 10, ["Gather:table"])  # embeddings: a Gather of a table
    assert tables and all(d["spec"]["op_type"] == "Gather" and
                          OpSpec.from_json(d["spec"]).c["n_param_inputs"] > 0 for d in tables)

    out = tmp_path / "ops"
    out.mkdir()
    from mdot_jax.kernels.op_profile import write_plan

    write_plan(out, base)
    run = dict(n=30, sources=[small_models], threads=1, progress=False, protocol=FAST_OPS,
               max_minutes=1e-9, more=10, kinds=kinds)  # plans, measures nothing
    profile_ops(out, **run)
    grown = read_plan(out)
    assert grown[: len(base)] == base and len(grown) == len(base) + len(more)
    assert all(d["extension"] == "Conv:depthwise,Add+10" for d in grown[len(base):])
    profile_ops(out, **run)
    assert read_plan(out) == grown  # not extended twice


def test_an_operator_sample_has_forward_backward_and_update():
    spec = OpSpec("Gemm", *_gemm_row(8, 64, 32), True)
    st = measure_op(spec, FAST_OPS, torch, "cpu", 1)
    assert st["fwd_ms"] > 0 and st["update_ms"] > 0 and st["median_ms"] >= st["bwd_ms"]
    assert st["repeats"] == 3 and st["inner"] >= 1
    loss = measure_op(loss_spec(4, 10), FAST_OPS, torch, "cpu", 1)
    assert loss["update_ms"] == 0.0 and loss["median_ms"] > 0


def _gemm_row(m, k, n):
    c = dict.fromkeys(CONFIG_FIELDS, 0.0)
    c.update(in_rank=2, in_d2=m, in_d3=k, out_rank=2, out_d2=m, out_d3=n, in_numel=m * k,
             out_numel=m * n, mm_batch=1, mm_m=m, mm_k=k, mm_n=n, n_param_inputs=2,
             elem_bytes=4)
    load = (2.0 * m * k * n, 4.0 * m * k * n, 4.0 * (m * k + k * n + n), 4.0 * m * n,
            k * n + n, 1.0)
    return tuple(c[f] for f in CONFIG_FIELDS), load


_CHILD = """
import sys
from mdot_jax.kernels.op_profile import OpProtocol, profile_ops
profile_ops(sys.argv[1], n=int(sys.argv[3]), sources=[sys.argv[2]], threads=1, progress=False,
            protocol=OpProtocol(warmup=1, repeats=3, side_repeats=1, min_repeat_ms=20.0,
                                max_spread=float("inf"), max_others=float("inf")))
"""


@pytest.mark.slow
def test_a_killed_run_loses_nothing_finished_and_resumes(small_models, tmp_path):
    out = tmp_path / "ops"
    child = subprocess.Popen([sys.executable, "-c", _CHILD, str(out), str(small_models), "40"])
    lines: list[bytes] = []
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and len(lines) < 5:
        time.sleep(0.2)
        if (out / "samples.jsonl").exists():
            lines = (out / "samples.jsonl").read_bytes().splitlines()
    assert child.poll() is None, "the run ended before it could be killed"
    os.kill(child.pid, signal.SIGKILL)
    child.wait()
    before = (out / "samples.jsonl").read_bytes()
    finished = [ln for ln in before.split(b"\n")[:-1]]  # complete lines at the kill
    assert subprocess.run([sys.executable, "-c", _CHILD, str(out), str(small_models), "40"]
                          ).returncode == 0
    after = (out / "samples.jsonl").read_bytes().split(b"\n")
    assert after[:len(finished)] == finished  # nothing finished was lost or changed
    samples = read_op_samples(out)
    keys = [d["key"] for d in samples]
    report = json.loads((out / "report.json").read_text())
    planned = [OpSpec.from_json(d["spec"]).key for d in read_plan(out)]
    assert len(keys) == len(set(keys)) and len(planned) == report["planned"]
    assert set(keys) | set(report["skipped"]) == set(planned)
    assert all(math.isfinite(d["label_ms"]) and d["stats"]["inner"] >= 1 for d in samples)


def test_a_packed_folder_reads_the_same_and_resumes_unpacked(small_models, tmp_path):
    """A committed operator folder keeps its JSON lines xz-packed (`samples.jsonl.xz`, ...):
    read as the plain files; a run there unpacks them first and appends, nothing re-measured,
    the packed files left as they were."""
    import lzma

    out = tmp_path / "ops"
    run = dict(sources=[small_models], threads=1, progress=False, protocol=FAST_OPS)
    profile_ops(out, n=6, **run)
    plain = read_op_samples(out), read_plan(out)
    for name in ("samples.jsonl", "plan.jsonl", "noisy.jsonl"):
        if (out / name).exists():
            (out / (name + ".xz")).write_bytes(lzma.compress((out / name).read_bytes()))
            (out / name).unlink()
    packed = (out / "samples.jsonl.xz").read_bytes()
    assert (read_op_samples(out), read_plan(out)) == plain
    profile_ops(out, n=6, **run)  # resumed: the plan is done
    assert read_op_samples(out) == plain[0] and (out / "samples.jsonl").exists()
    assert (out / "samples.jsonl.xz").read_bytes() == packed


def test_a_foreign_device_is_refused(small_models, tmp_path):
    out = tmp_path / "ops"
    out.mkdir()
    fp = dict(fingerprint(1), device_model="Some Other CPU")
    line = dict(key="Relu/0", spec={}, label_ms=1.0, stats={}, meta=dict(fingerprint=fp))
    (out / "samples.jsonl").write_text(json.dumps(line) + "\n")
    with pytest.raises(DatasetError, match=r"device_model .*new folder \(default: .*/ops in "):
        profile_ops(out, n=5, sources=[small_models], threads=1, progress=False, protocol=FAST_OPS)


def test_the_default_sources_are_the_model_datasets_only(small_models, tmp_path, monkeypatch):
    """A derived folder of operator samples (its lines name no `arch`) is not drawn from."""
    from mdot_jax.kernels.op_profile import default_sources

    derived = tmp_path / "data" / "derived"
    (derived / "cpu-x-fused").mkdir(parents=True)
    (derived / "cpu-x-fused" / "samples.jsonl").write_text(
        (small_models / "samples.jsonl").read_text())
    (derived / "cpu-x-ops-first").mkdir()
    (derived / "cpu-x-ops-first" / "samples.jsonl").write_text('{"key": "Conv/0"}\n')
    monkeypatch.chdir(tmp_path)
    assert default_sources() == [derived.relative_to(tmp_path) / "cpu-x-fused"]
