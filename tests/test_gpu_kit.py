"""The GPU kit (`benchmarks/gpu_kit.sh`): its dry run on this CPU makes what the GPU machine
sends back: at most 8 files directly under OUT, none over 16 MiB, the fingerprint and the
samples at the precisions asked for; run again, it resumes (nothing measured twice)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_the_kits_dry_run_makes_what_comes_back(tmp_path):
    out, work = tmp_path / "out", tmp_path / "work"
    # as on the GPU machine: no `mdot` program on the PATH, only a Python
    env = dict(os.environ, KIT_WORK=str(work), KIT_SECONDS="170", PYTHON=sys.executable,
               PATH="/usr/bin:/bin")
    for _ in range(2):  # the second run resumes
        subprocess.run(["bash", str(REPO / "benchmarks" / "gpu_kit.sh"), "--dry-run",
                        str(out)], check=True, env=env, timeout=300)
    files = sorted(p for p in out.rglob("*") if p.is_file())
    assert 4 <= len(files) <= 8 and all(p.parent == out for p in files)
    assert all(p.stat().st_size <= 16 * 2 ** 20 for p in files)
    env_json = json.loads((out / "env.json").read_text())
    assert env_json["fingerprint"]["precision"] == "amp-bf16"
    assert env_json["packages"]["torch"] and env_json["slug"].startswith("cpu-")
    # on a busy machine every sample may be judged noisy: both files count
    bf16 = [json.loads(x) for name in ("amp-bf16-samples.jsonl", "amp-bf16-noisy.jsonl")
            if (out / name).exists() for x in (out / name).read_text().splitlines()]
    assert len(bf16) == 2 and {d["workload"]["precision"] for d in bf16} == {"amp-bf16"}
    assert len({d["key"] for d in bf16}) == 2  # the second run measured nothing again
    kernels = [json.loads(x) for x in (out / "kernels.jsonl").read_text().splitlines()]
    assert len(kernels) == len({d["key"] for d in kernels}) >= 5  # resumed, nothing twice
    assert {d["kind"] for d in kernels} >= {"gemm", "add"} and kernels[0]["ms"] > 0
    nhwc = [json.loads(x) for name in ("samples.jsonl", "noisy.jsonl")  # noisy: not sent back
            if (work / "amp-bf16-nhwc" / name).exists()
            for x in (work / "amp-bf16-nhwc" / name).read_text().splitlines()]
    assert [d["workload"]["layout"] for d in nhwc] == ["nhwc"]  # channels-last, once
    fp32 = [json.loads(x) for name in ("samples.jsonl", "noisy.jsonl")  # noisy: not sent back
            if (work / "fp32" / name).exists()
            for x in (work / "fp32" / name).read_text().splitlines()]
    assert fp32 and all(d["stats"]["trace"]["aten_ops"] > 0 for d in fp32)  # --trace
    llm = [json.loads(x) for x in (out / "llm-steps.jsonl").read_text().splitlines()]
    assert len(llm) == len({d["key"] for d in llm}) >= 1  # resumed, nothing twice
    assert all(d["ms"] > 0 and d["job"]["seq_len"] == 64 for d in llm)
    assert [d["compile_backend"] for d in llm if d["job"].get("compile")] == ["aot_eager"]
    log = (out / "kit.log").read_text()
    assert log.count("== done in") == 2 and "Traceback" not in log
    assert "%|" not in log and "\r" not in log  # no progress-bar frames come back


def test_the_kits_gpu_set_names_zoo_models():
    """A misspelt name would cost a lease: the GPU set's step would measure nothing."""
    pytest.importorskip("torchvision")
    import re

    from mdot_jax.measure.zoo import find_model

    kit = (REPO / "benchmarks" / "gpu_kit.sh").read_text()
    names = ",".join(re.findall(r"^\s*GPU_MODELS\+?=,?(\S+)", kit, re.M)).split(",")
    assert len(names) >= 12
    assert all(find_model(n).name == n for n in names)
    cnns = re.search(r"^\s*CNN_MODELS=(\S+)", kit, re.M).group(1).split(",")
    assert cnns and set(cnns) <= set(names)  # channels-last: the GPU set's own CNNs
    # the pre-lease check on the lease image's versions (`kit_versions.sh`) reads the same set
    check = (REPO / "benchmarks" / "kit_versions.sh").read_text()
    pipeline = re.search(r"^GPU_SET=\$\((.*)\)$", check, re.M).group(1)
    read = subprocess.run(["bash", "-c", pipeline], cwd=REPO, capture_output=True, text=True)
    assert read.stdout.strip().split(",") == names


def test_after_a_lease_the_kits_files_are_laid_out_and_the_studies_run_in_order(tmp_path):
    """`benchmarks/after_lease.sh`: the kit's files under data/<slug>/ as the loader reads them,
    then resequence, pack, the priced steps and the pre-registered studies, in that
    order; a folder that exists stops it before anything is written."""
    kit = tmp_path / "kit"
    kit.mkdir()
    (kit / "env.json").write_text(json.dumps({"slug": "gpu-nvidia-b200"}))
    for f in ("amp-bf16-samples.jsonl", "amp-bf16-nhwc-samples.jsonl", "fp32-samples.jsonl",
              "kernels.jsonl", "llm-steps.jsonl", "kit.log"):
        (kit / f).write_text("{}\n")
    script = [str(REPO / "benchmarks" / "after_lease.sh"), str(kit), "b200 sxm"]
    dest = tmp_path / "gpu-nvidia-b200-lease-1"
    done = subprocess.run(["bash", *script, str(dest)], env=dict(os.environ, DRY="1"),
                          capture_output=True, text=True, timeout=60)
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("+ ")]
    assert done.returncode == 0 and not dest.exists()  # said, not done
    steps = [next(i for i, ln in enumerate(lines) if needle in ln) for needle in (
        "amp-bf16/samples.jsonl.xz", "dataset resequence", "dataset pack", "bench_gpu_ops.py",
        "bench_llm_steps.py", "bench_unaligned_gemms.py", "bench_cnn_kernels.py",
        "bench_layers.py", "bench_broadcast.py", "bench_channels_last.py")]
    assert steps == sorted(steps)
    assert not any("amp-bf16-nhwc-fused=" in ln for ln in lines)  # cnn-kernels: NCHW steps
    assert r"--device b200\ sxm" in lines[steps[3]]
    dest.mkdir()
    refused = subprocess.run(["bash", *script, str(dest)], capture_output=True, text=True,
                             timeout=60)
    assert refused.returncode == 2 and "exists; name another DEST" in refused.stderr
    assert list(dest.iterdir()) == []
    # a precision the kit brought no samples of, a sweep that did not come back: the rest runs
    (kit / "fp32-samples.jsonl").unlink()
    (kit / "kernels.jsonl").unlink()
    other = tmp_path / "gpu-nvidia-b200-lease-2"
    done = subprocess.run(["bash", *script, str(other)], env=dict(os.environ, DRY="1"),
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "no fp32 samples" in done.stdout
    said = [ln for ln in done.stdout.splitlines() if ln.startswith("+ ")]
    assert any("amp-bf16-fused" in ln for ln in said)
    assert not any("fp32-" in ln or "fp32/" in ln or "kernels.jsonl" in ln for ln in said)
    assert any("bench_llm_steps.py" in ln for ln in said)
    assert not any("bench_cnn_kernels.py" in ln or "unaligned" in ln or "bench_layers" in ln
                   or "bench_broadcast" in ln for ln in said)
    # a kit whose GPU set failed (no samples at all) still lays out its sweep and LLM steps
    (kit / "amp-bf16-samples.jsonl").unlink()
    (kit / "amp-bf16-nhwc-samples.jsonl").unlink()
    (kit / "kernels.jsonl").write_text("{}\n")
    done = subprocess.run(["bash", *script, str(tmp_path / "gpu-nvidia-b200-lease-3")],
                          env=dict(os.environ, DRY="1"), capture_output=True, text=True,
                          timeout=60)
    said = [ln for ln in done.stdout.splitlines() if ln.startswith("+ ")]
    assert done.returncode == 0 and "cnn-kernels study waits" in done.stdout
    assert said[0].startswith("+ mkdir -p") and said[1].startswith("+ xz")  # into its folder
    assert not any("resequence" in ln or "bench_cnn_kernels.py" in ln for ln in said)
    assert any("bench_unaligned_gemms.py" in ln for ln in said)
    (kit / "kernels.jsonl").unlink()
    (kit / "llm-steps.jsonl").unlink()
    nothing = subprocess.run(["bash", *script, str(tmp_path / "gpu-nvidia-b200-lease-4")],
                             capture_output=True, text=True, timeout=60)
    assert nothing.returncode == 2 and "no samples, no kernel sweep" in nothing.stderr
