"""The package's shape: imports go one way, and the shipped checkpoints install with the wheel."""

import ast
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _module(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> set[str]:
    """Every module `path` imports, at any depth of the file (lazy imports included)."""
    package = _module(path).rsplit(".", 1)[0] if path.name != "__init__.py" else _module(path)
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1]
                                + ([base] if base else []))
            found.add(base)
            found |= {f"{base}.{a.name}" for a in node.names}
    return found


def import_graph() -> dict[str, set[str]]:
    """Our modules -> the modules of ours they import."""
    files = [*REPO.glob("converters/*.py"), *REPO.glob("mdot_jax/**/*.py")]
    modules = {_module(f): f for f in files}
    return {m: {i for i in _imports(f) if i in modules} for m, f in modules.items()}


def _reachable(graph, start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        for nxt in graph[todo.pop()] - seen:
            seen.add(nxt)
            todo.append(nxt)
    return seen


def test_converters_never_import_mdot_jax():
    graph = import_graph()
    for m in (m for m in graph if m.startswith("converters")):
        assert not any(i.startswith("mdot_jax") for i in graph[m]), m


def test_serving_never_reaches_training_evaluation_or_the_cli():
    graph = import_graph()
    for m in (m for m in graph if m.startswith("mdot_jax.serving")):
        bad = {i for i in _reachable(graph, m)
               if i.startswith(("mdot_jax.training", "mdot_jax.evaluation", "mdot_jax.cli"))}
        assert not bad, f"{m} reaches {sorted(bad)}"


def test_no_import_cycles_and_only_the_cli_imports_the_cli():
    graph = import_graph()
    for m in graph:
        if m in ("mdot_jax", "mdot_jax.cli"):  # the lazy public API re-exports everything
            continue
        assert m not in _reachable(graph, m) - {"mdot_jax"}, f"{m} imports itself back"
        assert "mdot_jax.cli" not in graph[m], m
        assert m == "mdot_jax.cli" or "mdot_jax.cli_build" not in graph[m], m


def test_a_spec_sheets_prediction_imports_no_jax(tmp_path):
    """JAX, Flax and Orbax serve the checkpoints' networks: a GPU priced from its spec sheet
    loads none of them (they were half a second of every such command)."""
    import onnx
    from onnx_builders import conv_bn_relu

    onnx.save(conv_bn_relu(), tmp_path / "m.onnx")
    code = textwrap.dedent(f"""
        import sys
        from mdot_jax import TrainingJob, predict
        p = predict(TrainingJob(model={str(tmp_path / "m.onnx")!r}, batch_size=4,
                                device="h100-sxm", precision="amp-bf16"))
        assert p.iteration_ms > 0
        print(sorted(m for m in ("jax", "flax", "optax", "orbax") if m in sys.modules))
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=REPO, env=dict(os.environ, PYTHONPATH=str(REPO)), check=True)
    assert out.stdout.strip().splitlines()[-1] == "[]", out.stderr[-2000:]


def test_the_cli_is_thin():
    """Parsing and printing: a short entry module, no subprocesses, and `mdot --help` shows
    the commands for predicting apart from those that build data and models."""
    from mdot_jax.cli import build_parser

    cli = REPO / "mdot_jax" / "cli.py"
    assert len(cli.read_text().splitlines()) <= 450
    for f in REPO.glob("mdot_jax/cli*.py"):
        assert "subprocess" not in _imports(f), f
    text = build_parser().format_help()
    user, build = text.index("predicting:"), text.index("building data and models:")
    assert user < text.index("  predict ") < text.index("  probe ") < build
    assert build < text.index("  profile ") and build < text.index("  train ")


@pytest.mark.parametrize("command", ["predict", "plan"])
def test_a_commands_flags_are_in_help_groups(command):
    """`mdot predict --help` lists 50 flags: each under a heading (the model and its inputs,
    the device, the training step, parallelism, the whole job, output), none loose under
    "options" but --help."""
    import argparse

    from mdot_jax.cli import build_parser

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    parser = sub.choices[command]
    loose = [a.option_strings for g in parser._action_groups if g.title == "options"
             for a in g._group_actions]
    assert loose == [["-h", "--help"]]
    titles = [g.title for g in parser._action_groups]
    order = ["the model and its inputs", "the training step", "parallelism and the cluster",
             "the whole job", "output"]
    assert [t for t in titles if t in order] == order


def test_the_graph_sees_lazy_imports():
    """The check above is only as good as the graph: a function-level import counts."""
    graph = import_graph()
    assert "mdot_jax.measure.zoo" in graph["mdot_jax.cli_build"]
    assert "mdot_jax.storage.checkpoint" in graph["mdot_jax.evaluation.evaluate"]


def test_no_two_modules_share_a_name():
    names = [p.stem for p in REPO.glob("mdot_jax/**/*.py") if p.stem != "__init__"]
    names += [p.name for p in REPO.glob("mdot_jax/*/") if (p / "__init__.py").exists()]
    assert sorted(n for n in set(names) if names.count(n) > 1) == []


def test_no_code_line_cites_a_study_section_or_a_date():
    """Studies and their dates live in docs/studies/; code states rules."""
    import re

    cite = re.compile(r"section \d|sections \d|\b20\d\d-\d\d-\d\d\b|issue \d")
    files = [*REPO.glob("mdot_jax/**/*.py"), *REPO.glob("converters/*.py"),
             *REPO.glob("tests/*.py"), *REPO.glob("benchmarks/*.py"),
             *REPO.glob("benchmarks/*.sh")]
    bad = [f"{f.relative_to(REPO)}:{n}" for f in files
           for n, line in enumerate(f.read_text().splitlines(), 1) if cite.search(line)
           and f.name != "test_layout.py"]
    assert bad == []


@pytest.mark.slow
def test_a_wheel_install_predicts_with_its_shipped_checkpoints(tmp_path):
    """`pip install .` (not editable) in a fresh venv ships the checkpoints (and the named
    models' configs) as package data, and `mdot predict` finds them from any working
    directory."""
    dist = tmp_path / "dist"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                    "-q", "-w", str(dist), str(REPO)], check=True, cwd=tmp_path)
    wheel, = dist.glob("mdot_jax-*.whl")
    assert wheel.stat().st_size <= 20 * 2**20  # the package and its checkpoints, no data
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)],
                   check=True)
    py = venv / "bin" / "python"
    subprocess.run([py, "-m", "pip", "install", "--no-deps", "-q", str(wheel)], check=True)
    script = textwrap.dedent("""
        import sys, onnx, mdot_jax
        from mdot_jax.storage.shipped import resolve_checkpoint, shipped_checkpoints
        sys.path.insert(0, sys.argv[1])
        from onnx_builders import conv_bn_relu
        onnx.save(conv_bn_relu(), "m.onnx")
        print(mdot_jax.__file__)
        print(resolve_checkpoint(None))
        print(",".join(shipped_checkpoints()))
        from mdot_jax.measure import core_set
        print(len(core_set.load()["probe"]))
        from mdot_jax.serving.named_models import named
        print(sum(m.config.is_file() for m in named().values()), len(named()))
    """)
    work = tmp_path / "elsewhere"
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = subprocess.run([py, "-c", script, str(REPO / "tests")], cwd=work, env=env,
                         capture_output=True, text=True, check=True).stdout.split("\n")
    assert out[0].startswith(str(venv)) and out[1].startswith(str(venv))
    assert {"timm-rtx3090", "cpu-amd-epyc-f26m2-2t"} <= set(out[2].split(","))
    assert out[3] == "12"  # the probe ships as package data: `mdot probe` works anywhere
    files, names = out[4].split()  # the named models' config.json files ship too
    assert files == names and int(names) > 0
    pred = subprocess.run([venv / "bin" / "mdot", "predict", "m.onnx", "--batch-size", "8",
                           "--json"], cwd=work, env=env, capture_output=True, text=True)
    assert pred.returncode == 0, pred.stderr
    assert '"iteration_ms"' in pred.stdout


def test_cmd_predict_parses_builds_the_request_calls_and_prints():
    """The front door: `cmd_predict` maps flags to a `TrainingJob`; the library decides."""
    import ast

    tree = ast.parse((REPO / "mdot_jax" / "cli.py").read_text())
    fn = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "cmd_predict")
    assert fn.end_lineno - fn.lineno + 1 <= 40
    called = {n.func.id for n in ast.walk(fn) if isinstance(n, ast.Call)
              and isinstance(n.func, ast.Name)}
    assert {"TrainingJob", "predict"} <= called


def test_one_vocabulary_of_precisions_optimizers_and_plans():
    """Each option vocabulary is written once (`mdot_jax.options`); a second copy drifted
    before (a workload's precision one-hot lacked tf32 and amp-bf16)."""
    import re

    words = re.compile(r"[\[(]\s*\"(fp32|sgd|ddp|nvlink|nchw|train)\",\s*\"")
    own = REPO / "mdot_jax" / "options.py"
    bad = [f"{f.relative_to(REPO)}:{n}" for f in REPO.glob("mdot_jax/**/*.py") if f != own
           for n, line in enumerate(f.read_text().splitlines(), 1) if words.search(line)]
    assert bad == []


def test_each_concern_has_one_home():
    """GPU pricing in `gpu`, kernel-cost modelling in `kernels`, storage below training and
    serving; the networks (`models`) know nothing of profiling (`measure`)."""
    graph = import_graph()
    for m in (m for m in graph if m.startswith("mdot_jax.models")):
        assert not {i for i in graph[m] if i.startswith("mdot_jax.measure")}, m
    for m in (m for m in graph if m.startswith("mdot_jax.storage")):
        bad = {i for i in _reachable(graph, m) if i.startswith(
            ("mdot_jax.training", "mdot_jax.serving", "mdot_jax.evaluation"))}
        assert not bad, f"{m} reaches {sorted(bad)}"
    gpu = [p.stem for p in REPO.glob("mdot_jax/*/*.py") if "gpu" in p.stem
           or p.stem in ("spec_sheet", "parallel", "neusight", "catalog")]
    assert all((REPO / "mdot_jax" / "gpu" / f"{s}.py").exists() for s in gpu), gpu


def test_no_module_is_over_500_lines():
    """Small modules, one concern each: a long one is split by concern, not trimmed."""
    long = {f"{f.relative_to(REPO)}: {n}" for f in [*REPO.glob("mdot_jax/**/*.py"),
                                                   *REPO.glob("converters/*.py")]
            if (n := len(f.read_text().splitlines())) > 500}
    assert long == set()
