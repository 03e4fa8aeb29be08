"""The GPU catalog: spec sheets that are complete, sourced and self-consistent; names that
resolve (or say what is close); `mdot devices`; `--device` naming the checkpoint's GPU."""

import json
import math
import re
from pathlib import Path

import onnx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mdot_jax.cli import main
from mdot_jax.gpu import catalog as gpus

REQUIRED = ("p4", "p100", "v100-pcie", "v100-sxm2", "t4", "a10", "a10g", "l4", "l40s",
            "a100-pcie-40gb", "a100-sxm-40gb", "a100-pcie-80gb", "a100-sxm-80gb", "h100-pcie",
            "h100-sxm", "h100-nvl", "h200", "rtx3090", "rtx4090", "a6000", "rtx-6000-ada",
            "rtx-8000", "rtx5090", "h800", "a800", "h200-nvl", "gb200")


def run(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    assert "Traceback" not in err
    return code, out, err


def test_the_catalog_holds_the_gpus_users_choose_among():
    catalog = gpus.catalog()
    assert len(catalog) >= 20
    assert len({gpus.find(name).name for name in REQUIRED}) == len(REQUIRED)
    owners: dict[str, set[str]] = {}
    for g in catalog.values():
        for a in (g.name, *g.aliases):
            owners.setdefault(gpus._key(a), set()).add(g.name)
    assert {k: v for k, v in owners.items() if len(v) > 1} == {}  # one GPU per name


@pytest.mark.parametrize("gpu", list(gpus.catalog().values()), ids=lambda g: g.name)
def test_every_row_is_sourced_and_consistent(gpu):
    assert gpu.architecture in gpus.ARCHITECTURES
    assert ("datasheet" in gpu.source or "whitepaper" in gpu.source) and "https://" in gpu.source
    # peak FP32 = SMs x cores per SM x 2 (a fused multiply-add) x boost clock
    peak = gpu.sms * gpu.cores_per_sm * 2 * gpu.boost_mhz / 1e6
    assert abs(gpu.tflops["fp32"] / peak - 1) < 0.05, peak
    tensor = [gpu.tflops[p] for p in ("tf32", "fp16", "bf16")]
    if gpu.architecture in ("ampere", "ada", "hopper", "blackwell", "rtx-blackwell"):
        assert all(t and t >= gpu.tflops["fp32"] for t in tensor)
    else:  # TF32 and bf16 came with Ampere
        assert gpu.tflops["tf32"] is None and gpu.tflops["bf16"] is None
    # the board's power: published for every GPU but the A10G (AWS's) and the GB200 (its
    # superchip's), each said in its note
    assert gpu.power_w >= 70 or (gpu.name in ("nvidia-a10g", "nvidia-gb200")
                                 and "power" in gpu.note)
    # a reference system's network between nodes: only on boards of NVSwitch (SXM) parts, the
    # system named (a DGX, or the H800's nodes as DeepSeek published them)
    assert not gpu.network_gbs or (gpu.nvswitch and "network" in gpu.source)
    # a reference system's host (an offloaded optimizer's): its CPUs named in the source
    assert not gpu.host_gbs or ("host: DGX" in gpu.source
                                and ("Xeon" in gpu.source or "EPYC" in gpu.source))


def test_boards_of_one_chip_differ_by_their_power():
    """The A100 PCIe cards share a spec sheet but not a power limit (250 W, 300 W)."""
    pcie40, pcie80 = gpus.find("a100-pcie-40gb"), gpus.find("a100-pcie-80gb")
    assert pcie40.tflops == pcie80.tflops and pcie40.power_w < pcie80.power_w
    assert gpus.find("h100-sxm").power_w == 2 * gpus.find("h100-pcie").power_w


def test_export_boards_are_their_siblings_with_less_nvlink():
    """The A800 and H800 are the A100 SXM and H100 SXM with NVLink cut to 400 GB/s: the same
    kernels, slower collectives inside a node (a ring at 400 / 900 of the H100's)."""
    from mdot_jax.gpu import parallel

    for board, sibling in (("h800", "h100-sxm"), ("a800", "a100-sxm-80gb")):
        b, s = gpus.find(board), gpus.find(sibling)
        assert (b.tflops, b.memory_gbs, b.sms, b.boost_mhz) == (s.tflops, s.memory_gbs, s.sms,
                                                               s.boost_mhz)
        assert b.nvlink_gbs == 400 < s.nvlink_gbs and b.nvswitch
        ring = [parallel.ring_link(g, 8, 1, None) for g in (b, s)]
        assert [r.name for r in ring] == ["nvlink"] * 2
        ms = [parallel.allreduce_ms(13e9, 8, r, 1) for r in ring]
        assert ms[0] / ms[1] == pytest.approx(s.nvlink_gbs / 400, rel=0.01)
    # DeepSeek's H800 nodes: eight 400 Gb/s NICs, the H100's DGX's; the A800's: none published
    assert gpus.find("h800").network_gbs == gpus.find("h100-sxm").network_gbs == 400
    assert gpus.find("a800").network_gbs == 0 and "--network-gbs" in gpus.find("a800").note


def test_an_nvl72_racks_gpus_share_one_nvlink_fabric():
    """A GB200 NVL72 joins its 72 GPUs by NVLink: a ring over them stays on NVLink; past 72 in
    one node the note says its fabric's size (not a board's 8); racks are the nodes."""
    from onnx_builders import attention

    from mdot_jax import TrainingJob, predict
    from mdot_jax.gpu import parallel

    gb200 = gpus.find("gb200")
    assert (gb200.node_gpus, gpus.find("b200").node_gpus, gpus.find("l4").node_gpus) == (72, 8, 8)
    assert parallel.ring_link(gb200, 72, 1, None).name == "nvlink"
    job = dict(model=attention(seq=64, dim=256), batch_size=4, device="gb200")
    notes = {n: [w for w in predict(TrainingJob(**job, gpus=n)).warnings
                 if w.startswith(f"gpus {n}:")] for n in (72, 144)}
    assert notes[72] == [] and len(notes[144]) == 1
    assert "its NVLink joins 72: give gpus 72 and nodes 2" in notes[144][0]
    eight = predict(TrainingJob(**dict(job, device="b200"), gpus=16)).warnings
    assert any("DGX systems hold 8: give gpus 8 and nodes 2" in w for w in eight)
    bridged = dict(gb200.to_json(), name="my-gb200", nvswitch=False)  # a fabric is switched
    with pytest.raises(ValueError, match="'nvlink_gpus' is 72: an NVLink fabric joining"):
        gpus._from_json(bridged, "my-gb200.json")


@pytest.mark.parametrize("name,found", [
    ("NVIDIA H100 80GB HBM3", "nvidia-h100-sxm"),  # what torch.cuda.get_device_name says
    ("H100 SXM", "nvidia-h100-sxm"), ("Tesla T4", "nvidia-t4"), ("rtx3090", "nvidia-rtx-3090"),
    ("nvidia-l4", "nvidia-l4"), ("NVIDIA A100-SXM4-40GB", "nvidia-a100-sxm-40gb"),
    ("NVIDIA B200", "nvidia-b200-sxm"), ("l40", "nvidia-l40"), ("L40S", "nvidia-l40s"),
    ("NVIDIA H800", "nvidia-h800-sxm"), ("h200", "nvidia-h200-sxm"),
    ("H200 NVL", "nvidia-h200-nvl"),
    ("NVIDIA GeForce RTX 3080", "nvidia-rtx-3080"), ("NVIDIA A40", "nvidia-a40"),
    ("H100-SXM5-80GB", "nvidia-h100-sxm"), ("H100 PCIe 80GB", "nvidia-h100-pcie"),  # words
    ("H100 NVL 94GB", "nvidia-h100-nvl"), ("RTX 3090 24GB", "nvidia-rtx-3090"),
    ("Tesla V100-SXM2-16GB", "nvidia-v100-sxm2-16gb"), ("v100", "nvidia-v100-sxm2-32gb"),
])
def test_names_resolve(name, found):
    assert gpus.find(name).name == found


@pytest.mark.parametrize("name,needle", [
    ("h100", "ambiguous: nvidia-h100-pcie, nvidia-h100-sxm, nvidia-h100-nvl"),
    ("h10O-sxm", "did you mean nvidia-h100-sxm"),
    ("tpu-v5e", "no GPU 'tpu-v5e' in the catalog"),
    ("H100 80GB", "ambiguous: nvidia-h100-pcie, nvidia-h100-sxm$"),
    # a size the catalog lacks is not another board's; the close ones share its model number
    ("Tesla P100-PCIE-12GB", "did you mean nvidia-p100-pcie-16gb\\?"),
    # several GPUs where one goes: a plan compares them (it listed every A100 and H100)
    ("h100-sxm, a100", "one GPU here; `mdot plan MODEL --devices h100-sxm,a100 --gpus 1`"),
])
def test_unknown_names_say_what_is_close(name, needle):
    with pytest.raises(ValueError, match=needle):
        gpus.find(name)


def test_a_spec_file_reads_as_the_catalog_row(tmp_path):
    row = gpus.find("l4").to_json()
    (tmp_path / "l4.json").write_text(json.dumps(row))
    assert gpus.from_spec_file(tmp_path / "l4.json") == gpus.find("l4")
    for bad, needle in [(dict(row, sms=0), "'sms' is 0"), (dict(row, tflops={}), "'fp32'"),
                        (dict(row, colour="green"), "unknown field(s) ['colour']"),
                        (dict(row, tflops=dict(fp32=1.0, fp4=2.0)), "unknown precision")]:
        (tmp_path / "bad.json").write_text(json.dumps(bad))
        with pytest.raises(ValueError) as e:
            gpus.from_spec_file(tmp_path / "bad.json")
        assert needle in str(e.value) and "bad.json" in str(e.value)


def test_mdot_devices_lists_the_catalog(capsys):
    code, out, _ = run(capsys, "devices", "--json")
    rows = json.loads(out)
    assert code == 0 and len(rows) == len(gpus.catalog()) and all(r["source"] for r in rows)
    code, out, _ = run(capsys, "devices")
    assert code == 0 and "nvidia-h100-sxm" in out and "989.4" in out


def test_mdot_devices_shows_the_gpus_named(capsys, tmp_path):
    code, out, _ = run(capsys, "devices", "--json", "h100", "NVIDIA GeForce RTX 3090", "h100-sxm")
    names = [r["name"] for r in json.loads(out)]
    assert code == 0 and names == [g.name for g in gpus.matching("h100")] + ["nvidia-rtx-3090"]
    assert len(names) == 4  # each once, the H100's three
    (tmp_path / "l4.json").write_text(run(capsys, "devices", "--json", "l4")[1])
    assert gpus.from_spec_file(tmp_path / "l4.json") == gpus.find("l4")  # docs/gpus.md's start
    code, _, err = run(capsys, "devices", "h1000")
    assert code == 2 and err.count("\n") == 1 and "no GPU 'h1000'" in err


def test_predict_names_a_gpu_by_any_of_its_names(capsys, tmp_path):
    import onnx
    from onnx_builders import conv_bn_relu

    model = tmp_path / "m.onnx"
    onnx.save(conv_bn_relu(), model)
    args = ["predict", model, "--batch-size", "2", "--json"]
    ms = {json.loads(run(capsys, *args, "--device", d)[1])["iteration_ms"]
          for d in ("rtx3090", "nvidia-rtx-3090", "NVIDIA GeForce RTX 3090")}
    assert len(ms) == 1
    code, _, err = run(capsys, *args, "--device", "nvidia-h100-sxm", "--checkpoint",
                       "timm-rtx3090")
    assert code == 2 and "in the GPU catalog, but this checkpoint predicts for" in err
    assert "without --checkpoint" in err and err.count("\n") == 1
    code, _, err = run(capsys, *args, "--device", "h10O-sxm")
    assert code == 2 and "did you mean nvidia-h100-sxm" in err
    code, _, err = run(capsys, *args, "--device", "mi300x")  # named first, by its flag
    assert err.startswith("mdot: error: --device 'mi300x': no GPU 'mi300x' in the catalog")
    code, _, err = run(capsys, *args, "--precision", "fp64")
    assert code == 2 and "invalid choice: 'fp64'" in err


SPEC_FIELDS = ("sms", "boost_mhz", "memory_gb", "memory_gbs", "l2_mb", "nvlink_gbs",
               "pcie_gbs", "nvswitch", "tflops")


@pytest.mark.parametrize("field,value,needle", [
    ("memory_gbs", float("nan"), "'memory_gbs' is nan"),
    ("boost_mhz", float("nan"), "'boost_mhz' is nan"),
    ("sms", float("inf"), "'sms' is inf"),
    ("l2_mb", 1e12, "expected 0.25 to 1024 MB"),
    ("tflops", {"fp32": float("nan")}, "positive 'fp32'"),
    ("tflops", {"fp32": 60, "bf16": float("inf")}, "'tflops.bf16' is inf"),
    ("nvswitch", None, "'nvswitch' is None"),
    ("power_w", -300, "'power_w' is -300"),
    ("power_w", "700 W", "'power_w' is '700 W'"),
    ("network_gbs", -400, "'network_gbs' is -400"),
    ("host_gbs", 614e3 * 1e3, "'host_gbs' is 614000000.0; expected 1 to 100000 GB/s"),
    ("nvlink_gpus", 1, "'nvlink_gpus' is 1; expected 2 to 1000 GPUs, a whole number (0: none)"),
    ("nvlink_gpus", 72.5, "'nvlink_gpus' is 72.5; expected 2 to 1000 GPUs, a whole number"),
    ("sms", 131.5, "'sms' is 131.5; expected 1 to 1000 streaming multiprocessors (not CUDA "
                   "cores), a whole number"),
    ("architecture", "hoper", "did you mean 'hopper'"),  # else no Hopper measurement applies
    ("architecture", "", "'architecture' is ''"),
    ("architecture", 9.0, "'architecture' is 9.0"),
    ("compute_capability", "nine", "'compute_capability' is 'nine'"),
    ("compute_capability", 9.0, "'compute_capability' is 9.0"),
    ("boost_mhz", 1.98, "'boost_mhz' is 1.98; expected 300 to 5000 MHz"),  # GHz
    ("memory_gbs", 3.35, "'memory_gbs' is 3.35; expected 50 to 100000 GB/s"),  # TB/s
    ("memory_gb", 81_920, "'memory_gb' is 81920; expected 0.1 to 4096 GB"),  # MB
    ("sms", 16_896, "(not CUDA cores)"),  # the H100 SXM's CUDA cores
    ("tflops", {"fp32": 66_900}, "'tflops.fp32' is 66900 but 132 SMs at 1980 MHz"),  # GFLOP/s
    ("tflops", {"fp32": 989.4}, "in another unit"),  # a tensor peak as the CUDA cores'
    # the datasheet's peaks with sparsity (1,979 bf16 TFLOP/s on the H100 SXM's)
    ("tflops", {"fp32": 66.9, "bf16": 1979}, "'tflops.bf16' is 1979, 2.0x the bf16 FLOPs"),
    ("tflops", {"fp32": 66.9, "fp8": 3958}, "the datasheet's figure with sparsity"),
    # another JSON type than the field's: Python's TypeError from deep in pricing, before
    ("aliases", 1, "'aliases' is 1; expected a list of names"), ("name", {"a": 1}, "'name' is"),
    ("nvswitch", "yes", "'nvswitch' is 'yes'"),
    ("note", 5, "'note' is 5; expected text"),
])
def test_a_spec_value_no_gpu_has_is_named(tmp_path, field, value, needle):
    """JSON's NaN and Infinity parse as floats: a 3.7x faster GPU, or a math error, before;
    so did units other than the field's (a 1,000x slower step, a 1 TB GPU that fits anything)
    and a datasheet's peaks with sparsity (tensor cores twice as fast as any Hopper part)."""
    row = dict(gpus.find("h100-sxm").to_json(), name="my-gpu")
    row[field] = value
    (tmp_path / "g.json").write_text(json.dumps(row))
    with pytest.raises(ValueError, match=re.escape(needle)):
        gpus.from_spec_file(tmp_path / "g.json")
    row[field] = None  # null: as if not given (a required field then missing)
    (tmp_path / "g.json").write_text(json.dumps(row))
    if field in ("name", "architecture", "sms", "boost_mhz", "memory_gb", "memory_gbs", "l2_mb",
                 "tflops"):
        with pytest.raises(ValueError, match=f"missing field\\(s\\) \\['{field}'\\]"):
            gpus.from_spec_file(tmp_path / "g.json")
    elif field != "nvswitch":  # the H100's NVLink asks for it
        assert gpus.from_spec_file(tmp_path / "g.json").name == "my-gpu"


@pytest.mark.parametrize("change", [
    dict(boost_mhz=1590),  # the base clock: its peaks an SM a clock 1.25x the boost's
    dict(architecture="rubin", tflops=dict(fp32=66.9, bf16=1979)),  # no catalogued kin
    dict(compute_capability="", architecture="ampere", sms=82, boost_mhz=1695,
         tflops=dict(fp32=35.6, fp16=71)),  # an RTX 3090 without its capability: 128 cores
])
def test_a_plausible_spec_reads(tmp_path, change):
    row = dict(gpus.find("h100-sxm").to_json(), name="my-gpu", **change)
    (tmp_path / "g.json").write_text(json.dumps(row))
    assert gpus.from_spec_file(tmp_path / "g.json").name == "my-gpu"


def test_a_specs_architecture_is_read_in_any_case_and_a_new_one_is_its_own(tmp_path):
    row = dict(gpus.find("h100-sxm").to_json(), name="my-gpu", architecture=" Hopper")
    (tmp_path / "g.json").write_text(json.dumps(row))
    assert gpus.from_spec_file(tmp_path / "g.json").architecture == "hopper"
    (tmp_path / "g.json").write_text(json.dumps(dict(row, architecture="rubin")))
    assert gpus.from_spec_file(tmp_path / "g.json").architecture == "rubin"
    del row["compute_capability"]  # PyTorch's flash attention: known from the architecture
    (tmp_path / "g.json").write_text(json.dumps(row))
    assert gpus.from_spec_file(tmp_path / "g.json").capability == 9.0


def test_a_spec_copy_of_an_sxm_board_keeps_its_nvlink(capsys, tmp_path):
    """A renamed copy of the H100 SXM row is priced over NVLink as the row itself is."""
    from onnx_builders import attention

    row = dict(gpus.find("h100-sxm").to_json(), name="my-h100", aliases=[])
    (tmp_path / "g.json").write_text(json.dumps(row))
    onnx.save(attention(seq=64, dim=64), tmp_path / "m.onnx")
    base = ["predict", str(tmp_path / "m.onnx"), "--batch-size", "8", "--gpus", "8", "--json"]
    assert main(base + ["--device", "h100-sxm"]) == 0
    catalogued = json.loads(capsys.readouterr().out)
    for extra in ([], ["--interconnect", "nvlink"]):
        assert main(base + ["--device-spec", str(tmp_path / "g.json"), *extra]) == 0
        mine = json.loads(capsys.readouterr().out)
        assert mine["iteration_ms"] == catalogued["iteration_ms"], extra
        assert any("nvlink bandwidth" in w for w in mine["warnings"])


@settings(max_examples=100, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.dictionaries(st.sampled_from(SPEC_FIELDS), st.one_of(
    st.none(), st.booleans(), st.integers(-10, 10 ** 13), st.floats(), st.text(max_size=3),
    st.dictionaries(st.sampled_from(["fp32", "tf32", "fp16", "bf16", "fp8"]),
                    st.one_of(st.none(), st.floats(), st.integers(-1, 10 ** 7))))))
def test_any_spec_file_is_a_gpu_with_finite_numbers_or_one_named_error(tmp_path, changes):
    row = dict(gpus.find("a100-pcie-80gb").to_json(), name="g", aliases=[], **changes)
    (tmp_path / "g.json").write_text(json.dumps(row))
    try:
        gpu = gpus.from_spec_file(tmp_path / "g.json")
    except ValueError as e:
        assert str(e).startswith(f"--device-spec {tmp_path / 'g.json'}: ") and "\n" not in str(e)
        return
    numbers = [gpu.sms, gpu.boost_mhz, gpu.memory_gb, gpu.memory_gbs, gpu.l2_mb,
               gpu.nvlink_gbs, gpu.pcie_gbs, *(v for v in gpu.tflops.values() if v is not None)]
    assert all(math.isfinite(v) and v >= 0 for v in numbers) and gpu.tflops["fp32"] > 0
    assert isinstance(gpu.nvswitch, bool)


def test_the_readme_counts_the_catalog():
    """Each count of catalogued GPUs the README gives is the catalog's (it read 37 for 39)."""
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    counts = {int(n) for n in re.findall(r"(\d+) NVIDIA GPUs", readme)}
    assert counts == {len(gpus.catalog())}
