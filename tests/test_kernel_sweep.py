"""The kit's precision sweep (`mdot_jax.measure.kernel_sweep`): its shapes span tiles and
waves at every precision, fit a GPU's memory, and a dry run times kernels on this CPU and
resumes."""

import json
import time

import numpy as np
import pytest

from mdot_jax.measure import kernel_sweep


def test_the_plan_spans_kinds_precisions_and_sizes():
    rows = kernel_sweep.plan(False)
    assert len({r["key"] for r in rows}) == len(rows)
    gemms = [r for r in rows if r["kind"] in ("gemm", "bmm")]
    assert {r["precision"] for r in gemms} == set(kernel_sweep.GEMM_PRECISIONS)
    flops = np.asarray([kernel_sweep._work(r)[0] for r in gemms])
    assert flops.max() <= kernel_sweep.MAX_FLOPS and flops.max() / flops.min() > 1e4
    assert all(d % 16 == 0 for r in gemms for d in r["dims"][1:])  # fp8 needs multiples of 16
    first = [r["kind"] for r in rows[:20]]  # interleaved: a run cut short has every kind
    assert {"gemm", "sdpa-flash", "add"} <= set(first) or {"bmm", "sdpa-flash", "add"} <= set(
        first)


def test_the_network_kernels_span_layouts_and_leave_the_measured_shapes_as_they_were():
    rows = kernel_sweep.plan(False)
    cnn = [r for r in rows if r["kind"].startswith(("conv", "batch_norm"))]
    assert {(r["kind"], r["layout"], r["precision"]) for r in cnn} == {
        (k, lay, p) for k in ("conv", "conv-train", "batch_norm", "batch_norm-train")
        for lay in ("nchw", "nhwc") for p in ("fp32", "bf16")}
    convs = {tuple(r["dims"]) for r in cnn if r["kind"] == "conv"}
    assert {d[4] for d in convs} == {1, 3} and len({d[2] for d in convs}) >= 4
    assert all(kernel_sweep._work(r)[0] <= kernel_sweep.MAX_FLOPS for r in cnn)
    assert {r["kind"] for r in rows} >= {"cross_entropy-train", "adamw", "adamw-fused"}
    measured = {r["key"] for r in kernel_sweep.read("data/gpu-nvidia-h200/kernels.jsonl.xz")}
    assert measured <= {r["key"] for r in rows}  # a lease's sweep resumes on the same shapes


def test_depthwise_convolutions_span_channels_kernels_and_strides_in_both_layouts():
    rows = [r for r in kernel_sweep.plan(False) if r["kind"].startswith("dwconv")]
    assert {(r["kind"], r["layout"], r["precision"]) for r in rows} == {
        (k, lay, p) for k in ("dwconv", "dwconv-train") for lay in ("nchw", "nhwc")
        for p in ("fp32", "bf16")}
    dims = {tuple(r["dims"]) for r in rows}
    assert len(dims) == 12 and {d[3] for d in dims} == {3, 5} and {d[4] for d in dims} == {1, 2}
    work = [kernel_sweep._work(r) for r in rows]
    assert all(0 < f and 0 < b <= kernel_sweep.MAX_BYTES for f, b in work)
    assert kernel_sweep._work(dict(kind="dwconv", precision="fp32", dims=(1, 1, 7, 3, 2)))[0] \
        == 2.0 * 16 * 9  # a 7 x 7 input at stride 2, padded: 4 x 4 outputs


def test_unaligned_heads_come_early_each_beside_its_aligned_twin():
    rows = kernel_sweep.plan(False)
    heads = [r for r in rows if r["kind"] == "linear-train"]
    vocabs = {r["dims"][1] for r in heads}
    assert {50257, 50304, 30522, 30528} <= vocabs
    assert {kernel_sweep.twin(v) for v in vocabs} <= vocabs and any(v % 8 for v in vocabs)
    assert {r["precision"] for r in heads} == {"fp32", "tf32", "fp16", "bf16"}
    assert rows.index(heads[-1]) < 8 * len(heads)  # a queue of its own (of 8), measured early
    assert all(kernel_sweep._work(r)[0] <= 2 * kernel_sweep.MAX_FLOPS for r in heads)


def test_unaligned_batched_gemms_each_beside_a_twin_aligned_to_8():
    """Eager attention's products at Swin's 49 and a ViT's 197 tokens, each beside the same
    batch of GEMMs at the next multiple of 8, at every GEMM arithmetic but fp8, early."""
    rows = kernel_sweep.plan(False)
    pairs = [r for r in rows if r["kind"] == "bmm-unaligned"]
    dims = {tuple(r["dims"]) for r in pairs}
    assert set(kernel_sweep.WINDOWS) <= dims and len(dims) == 2 * len(kernel_sweep.WINDOWS)
    assert (6144, 56, 56, 32) in dims and (384, 200, 64, 200) in dims  # the batch kept
    assert {r["precision"] for r in pairs} == {"fp32", "tf32", "fp16", "bf16"}
    assert rows.index(pairs[-1]) < 8 * 60  # in the heads' queue, measured early
    assert kernel_sweep._work(pairs[0]) == kernel_sweep._work(dict(pairs[0], kind="bmm"))


def test_broadcast_operands_a_mask_promoted_to_fp32_and_a_rotary_table():
    rows = [r for r in kernel_sweep.plan(False) if r["kind"].endswith("-bcast")]
    assert {(r["kind"], r["precision"]) for r in rows} == {
        (k, p) for k in ("add-bcast", "mul-bcast") for p in ("fp32", "bf16")}
    assert ("add-bcast", "bf16", (8, 12, 1024)) in {(r["kind"], r["precision"], tuple(r["dims"]))
                                                    for r in rows}  # GPT-2's eager scores
    mask = kernel_sweep._work(dict(kind="add-bcast", precision="bf16", dims=(8, 12, 1024)))
    assert mask == (8 * 12 * 1024 ** 2, 6.0 * 8 * 12 * 1024 ** 2 + 4 * 8 * 1024)  # fp32 out
    assert all(kernel_sweep._work(r)[1] <= 1.1 * kernel_sweep.MAX_BYTES for r in rows)
    small = [r for r in kernel_sweep.plan(True) if r["kind"].endswith("-bcast")]
    out = [kernel_sweep._kernel(r, "cpu")() for r in small]
    assert [tuple(o.shape) for o in out] == [(2, 2, 16, 16), (2, 16, 2, 8)]


def test_a_dry_run_times_kernels_and_resumes(tmp_path):
    out = tmp_path / "k.jsonl"
    assert kernel_sweep.main([str(out), "--dry-run", "--seconds", "0"]) == 0
    first = out.read_text().splitlines()
    assert len(first) == 1 and json.loads(first[0])["ms"] > 0
    assert kernel_sweep.main([str(out), "--dry-run"]) == 0
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    assert len(rows) == len(kernel_sweep.plan(True)) and rows[0] == json.loads(first[0])
    assert all("ms" in r or r["error"] for r in rows)
    assert all("ms" in r for r in rows if not r["kind"].startswith("sdpa"))  # CPU: no fused


def test_a_burst_is_timed_per_launch():
    calls = []
    ms = kernel_sweep._timed(lambda: calls.append(time.sleep(0.002)), "cpu", launches=5)
    assert len(calls) == 5 and 1.5 < ms < 20  # per launch, not the burst's total
    row = kernel_sweep.measure(kernel_sweep.plan(True)[0], "cpu")
    assert row["launches"] == 1 and row["ms_alone"] > 0 and len(row["ms_all"]) == 10


def test_a_kit_step_interrupted_in_a_row_keeps_what_it_wrote_and_resumes(tmp_path, capsys):
    """The kit stops a step with SIGINT when its time is up (`timeout -s INT`): the rows
    measured stay, the step says so in one line (no traceback in the kit's log), and a second
    run measures the rest."""
    from mdot_jax.measure import resumable

    rows = [{"key": f"k{i}"} for i in range(3)]

    def measure(row, device):
        if row["key"] == "k1" and not (tmp_path / "again").exists():
            raise KeyboardInterrupt
        return dict(row, ms=1.0)

    out = tmp_path / "rows.jsonl"
    assert resumable.main([str(out), "--dry-run"], "", lambda dry: rows, measure) == 130
    assert "interrupted in a row; 1 measured" in capsys.readouterr().err
    assert [json.loads(x)["key"] for x in out.read_text().splitlines()] == ["k0"]
    (tmp_path / "again").touch()
    assert resumable.main([str(out), "--dry-run"], "", lambda dry: rows, measure) == 0
    assert [json.loads(x)["key"] for x in out.read_text().splitlines()] == ["k0", "k1", "k2"]


def test_whole_layers_priced_by_structure_are_measured_at_their_precisions():
    """An LSTM (cuDNN's steps), SDPA given a learned bias and deformable attention's sampling:
    priced by structure (the sampling as copies), so the sweep times them; BEiT's token counts
    (197, 577: no multiple of 8) among the biased."""
    rows = kernel_sweep.plan(False)
    lstm = [r for r in rows if r["kind"] == "lstm-train"]
    biased = [r for r in rows if r["kind"] == "sdpa-biased"]
    assert {r["precision"] for r in lstm} == {"fp32", "fp16", "bf16"} and len(lstm) == 12
    assert {r["precision"] for r in biased} == {"fp16", "bf16"} and \
        {197, 577} <= {r["dims"][2] for r in biased}
    assert rows.index(biased[-1]) < 10 * len(lstm + biased)  # a queue of its own, early
    flops, nbytes = kernel_sweep._work(dict(kind="lstm-train", precision="fp32",
                                            dims=(1, 1, 1, 1)))
    assert flops == 48 and nbytes == 4 * 20  # 4 gates x (input + state) x 2 FLOPs, x 3 passes
    biased_work = kernel_sweep._work(dict(biased[0], dims=(1, 1, 2, 1)))
    masked_work = kernel_sweep._work(dict(biased[0], kind="sdpa-masked", dims=(1, 1, 2, 1)))
    assert biased_work[0] == masked_work[0] and biased_work[1] == masked_work[1] + 2 * 2 * 4
    sampled = [r for r in rows if r["kind"] == "grid_sample-train"]  # deformable attention's
    assert {r["precision"] for r in sampled} == {"fp32", "bf16"} and \
        {300, 13294} == {r["dims"][3] for r in sampled}  # a decoder's queries, an encoder's
    flops, nbytes = kernel_sweep._work(dict(sampled[0], dims=(1, 1, 2, 1, 1)))
    assert flops == 24 and nbytes == 4 * (3 + 2 * 4 + 3 * 2)  # out, level, grid: fwd + bwd


def test_the_layers_study_prices_each_measured_layer_as_exported_from_pytorch():
    """`benchmarks/bench_layers.py` (docs/studies/whole-layers.md, deformable-sampling.md):
    every measured row priced, an fp32 LSTM at fp32 and at TF32 too; an LSTM over more steps
    costs more, a sampling of more queries too; unmeasured rows are listed with why."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent.parent / "benchmarks"))
    import bench_layers

    rows = [dict(kind="lstm-train", precision="fp32", dims=(t, 2, 16, 1), key=f"l{t}",
                 device="nvidia-h100-sxm", ms=1.0) for t in (2, 64)]  # steps = batch too
    rows += [dict(kind="sdpa-biased", precision="bf16", dims=(2, 2, 64, 16), key="b",
                  device="nvidia-h100-sxm", ms=0.5),
             dict(kind="sdpa-biased", precision="fp16", dims=(2, 2, 64, 16), key="e",
                  error="no kernel"), dict(kind="add", precision="fp32", dims=(4, 4), key="a")]
    rows += [dict(kind="grid_sample-train", precision="fp32", dims=(4, 8, 16, q, 4),
                  key=f"g{q}", device="nvidia-h100-sxm", ms=0.1) for q in (16, 4096)]
    got = bench_layers.run(rows)
    assert set(got["summary"]) == {"lstm-train/fp32 as fp32", "lstm-train/fp32 as tf32",
                                   "sdpa-biased/bf16 as amp-bf16",
                                   "grid_sample-train/fp32 as fp32"}
    short, long = (r["priced_ms"] for r in got["rows"][:2])
    # the study's candidate, adopted: an fp32 LSTM's GEMMs run in TF32 on an H100
    assert long["fp32"] > 4 * short["fp32"] and long["tf32"] == pytest.approx(long["fp32"])
    few, many = (r["priced_ms"] for r in got["rows"][3:])
    assert set(few) == {"fp32"} and many["fp32"] > few["fp32"]
    assert got["skipped"] == {"no kernel": ["e"]} and len(got["rows"]) == 5


def test_the_broadcast_premise_is_decided_on_a_sweep(tmp_path):
    """`benchmarks/bench_broadcast.py` on a made-up sweep (shares chosen, not measured): the
    broadcast kinds at 0.3 of the bandwidth against contiguous twins at 0.9 hold the premise;
    at 0.8 they do not; small contiguous rows are not twins; a sweep without them is refused."""
    from benches import bench

    b = bench("bench_broadcast")
    bw = 3350e9  # the H100 SXM's bytes a second

    def row(kind, p, nbytes, share):
        return dict(kind=kind, precision=p, bytes=nbytes, ms=1e3 * nbytes / (share * bw),
                    device="NVIDIA H100 80GB HBM3")

    def sweep(bcast):
        return [row("add-bcast", p, 6e8, bcast) for p in ("fp32", "bf16")] + [
            row("mul-bcast", p, 2e8, bcast) for p in ("fp32", "bf16")] + [
            row("add", p, 3e8, 0.9) for p in ("fp32", "bf16")] + [
            row("mul", p, 1e6, 0.05) for p in ("fp32", "bf16")]  # small: not a twin

    def run(rows):
        path = tmp_path / "k.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        assert b.main(["--sweep", str(path), "--out", str(tmp_path / "out")]) == 0
        return json.loads((tmp_path / "out" / "results.json").read_text())

    held = run(sweep(0.3))
    assert held["premise_holds"] and set(held["by_precision"]) == {"fp32", "bf16"}
    assert held["by_precision"]["bf16"]["ratio"] == pytest.approx(0.3 / 0.9)
    assert held["by_precision"]["bf16"]["twins"] == 1  # the small mul left out
    assert not run(sweep(0.8))["premise_holds"]
    with pytest.raises(SystemExit, match="older than these kinds"):
        run([r for r in sweep(0.3) if r["kind"] in ("add", "mul")])
