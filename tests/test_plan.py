"""`mdot plan` (`serving.plan`): every GPU type x count priced once per model, feasible plans
ranked by cost under a deadline and a budget, what does not fit or cannot run said why, the
Pareto front plotted; bad requests are one named error."""

import dataclasses
import json
import math
import re

import onnx
import pytest
from onnx_builders import attention, conv_bn_relu

from mdot_jax import RequestError, TrainingJob
from mdot_jax.cli import main
from mdot_jax.readable import hours, number, percent
from mdot_jax.serving.plan import Plan, job_for_plan, pareto, plan

PRICES = {"h100-sxm": 3.99, "a100-sxm-80gb": 2.79, "nvidia-l4": 0.8}


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    path = tmp_path_factory.mktemp("plan") / "attn.onnx"
    onnx.save(attention(seq=64, dim=256), path)
    return str(path)


def _job(model, **fields):
    return TrainingJob(**{"model": model, "batch_size": 32, "epochs": 3,
                          "dataset_size": 1_000_000, "precision": "amp-bf16", **fields})


def test_plans_are_ranked_by_cost_and_judged(model):
    request = Plan(_job(model), devices=("h100-sxm", "a100-sxm-80gb", "l4", "v100"),
                   gpus=(1, 2, 4, 8), prices=PRICES, deadline_h=2.0)
    options = plan(request)
    assert len(options) == 16
    feasible = [o for o in options if o.feasible]
    assert feasible and options[:len(feasible)] == feasible  # feasible first
    costs = [o.cost_usd for o in feasible]
    assert costs == sorted(costs)
    for o in feasible:  # the job's hours x GPUs x the price
        usd = {"nvidia-h100-sxm": 3.99, "nvidia-a100-sxm-80gb": 2.79, "nvidia-l4": 0.8}
        assert o.cost_usd == pytest.approx(o.hours * o.gpus * usd[o.device])
        assert o.hours <= 2.0
    v100 = [o for o in options if o.device == "nvidia-v100-sxm2-32gb"]
    assert all(not o.feasible and "no bf16" in o.reasons[0] for o in v100)
    late = [o for o in options if any("past the deadline" in r for r in o.reasons)]
    assert all(o.hours > 2.0 for o in late)
    front = pareto(options)
    assert front and [o.hours for o in front] == sorted(o.hours for o in front)
    assert [o.cost_usd for o in front] == sorted((o.cost_usd for o in front), reverse=True)
    # each option printed as one line: the GPUs, hours, cost, memory, MFU; why not
    o = feasible[0]
    assert str(o) == (f"{o.gpus} x {o.device}: {hours(o.hours)} h, ${number(o.cost_usd)}, "
                      f"{number(o.prediction.memory_gb)} GB a GPU, MFU {percent(o.prediction.mfu)}")
    assert str(v100[0]).startswith(f"{v100[0].gpus} x nvidia-v100-sxm2-32gb: ")
    assert str(v100[0]).endswith(v100[0].reasons[-1]) and "GB a GPU" not in str(v100[0])


def test_counts_past_a_node_are_whole_nodes(model):
    """16 H100s are two nodes of eight (NVLink in each, the network between), not one node of
    16 all on NVLink, as they were priced; 12 fill no whole nodes and say so; a GB200 NVL72
    rack's NVLink joins 72. Each path: the counts, a strategy each, the layout search."""
    from mdot_jax.serving.front import predict

    job = _job(model, strategy="fsdp", gpus=8)
    options = {(o.device, o.gpus): o for o in plan(Plan(
        job, devices=("h100-sxm", "gb200"), gpus=(8, 12, 16)))}
    two_nodes = predict(dataclasses.replace(job, device="h100-sxm", gpus=8, nodes=2))
    assert options["nvidia-h100-sxm", 16].hours * 3600 == pytest.approx(two_nodes.job_s)
    one_node = predict(dataclasses.replace(job, device="h100-sxm", gpus=16))
    assert two_nodes.phases["communication"] > one_node.phases["communication"]
    assert options["nvidia-h100-sxm", 12].reasons == [
        "12 GPUs: 12 a node do not fill whole nodes of the nvidia-h100-sxm's 8 (an HGX board "
        "holds 8)"]
    assert options["nvidia-gb200", 12].feasible and options["nvidia-gb200", 16].feasible
    assert [options[d, 16].to_json()["nodes"] for d in ("nvidia-h100-sxm", "nvidia-gb200")] \
        == [2, 1]
    assert not any("in one node" in w for w in options["nvidia-gb200", 16].prediction.warnings)
    by_strategy = plan(Plan(_job(model), devices=("h100-sxm",), gpus=(16,),
                            strategies=("ddp", "fsdp")))
    assert (by_strategy[0].gpus, by_strategy[0].nodes, by_strategy[0].prediction.gpus) == \
        (16, 2, 16)
    assert not any("in one node" in w for w in by_strategy[0].prediction.warnings)
    searched = plan(Plan(_job(model, batch_size=4), devices=("h100-sxm",), gpus=(12, 16),
                         global_batch=64))
    assert {o.gpus for o in searched} == {12, 16}
    assert all(not any("in one node" in w for w in o.prediction.warnings) and o.nodes == 2
               for o in searched if o.gpus == 16)
    assert [o.reasons for o in searched if o.gpus == 12] == [[
        "12 GPUs: 12 a node do not fill whole nodes of the nvidia-h100-sxm's 8 (an HGX board "
        "holds 8)"]]
    alone = plan(Plan(_job(model, batch_size=4), devices=("h100-sxm",), gpus=(12,),
                      global_batch=64))
    assert [o.reasons for o in alone] == [o.reasons for o in searched if o.gpus == 12]


def test_a_budget_and_a_plan_the_counts_cannot_take(model):
    options = plan(Plan(_job(model), devices=("h100-sxm",), gpus=(1, 2), prices=PRICES,
                        budget_usd=1e-6))
    assert not any(o.feasible for o in options)
    assert all("over the budget ($1e-06)" in r for o in options for r in o.reasons)  # not $0
    unpriced = plan(Plan(_job(model), devices=("h100-nvl",), gpus=(1,), budget_usd=10.0,
                         prices=PRICES))  # not the NVL's
    assert "no price for the nvidia-h100-nvl" in unpriced[0].reasons[0]


@pytest.mark.parametrize("fields,field", [
    (dict(devices=()), "devices"), (dict(devices=("h1000",)), "devices"),
    (dict(devices="h100-sxm,,l4"), "devices"),
    (dict(gpus=(0,)), "gpus"), (dict(deadline_h=-1), "deadline_h"),
    (dict(budget_usd=float("nan")), "budget_usd"), (dict(prices={"h100-sxm": -2}), "prices"),
    (dict(prices={"tpu-v5": 2.0}), "prices"), (dict(prices={"a100": 2.0}), "prices"),
    (dict(budget_usd=10.0), "budget_usd"),  # no prices: every plan was "no price", said late
    (dict(gpus=2.5), "gpus"),
    # JSON of another type than the field's: Python's TypeError or AttributeError, a 500
    (dict(devices=1), "devices"), (dict(prices=-1), "prices"), (dict(strategies=2), "strategies"),
    (dict(global_batch=[16]), "global_batch"),
    # one GPU priced under two of its names: one price would be ignored
    (dict(prices={"h100-sxm": 3.99, "NVIDIA H100 80GB HBM3": 2.0}), "prices"),
])
def test_a_bad_plan_is_one_named_error(model, fields, field):
    with pytest.raises(RequestError) as e:
        plan(Plan(_job(model), **fields))
    assert e.value.field == field and "\n" not in str(e.value)  # the field as a request names it
    if fields == dict(budget_usd=10.0):
        assert "give prices too" in str(e.value)  # the field that holds them


def test_a_model_that_cannot_be_read_is_an_mdot_error(tmp_path):
    from mdot_jax import MdotError, ModelError

    with pytest.raises(MdotError, match="no such file") as e:
        plan(Plan(_job(str(tmp_path / "missing.onnx")), devices="l4", gpus=1))
    assert isinstance(e.value, ModelError)


def test_one_gpu_count_is_a_plan_of_it(model):
    one, listed = (plan(Plan(_job(model), devices="l4", gpus=g)) for g in (8, [8]))
    assert [o.to_json() for o in one] == [o.to_json() for o in listed]


def test_a_plan_that_does_not_fit_says_what_searches_for_one_that_does(model, capsys):
    big = _job(model, batch_size=1 << 17)  # activations far beyond any GPU
    alone, searched = (plan(Plan(big, devices=("l4",), gpus=(1,), **kw))[0]
                       for kw in ({}, dict(global_batch=1 << 17)))
    assert "does not fit" in alone.reasons[0] and "global_batch searches" in alone.reasons[0]
    assert all("global_batch" not in r for r in searched.reasons)
    # DDP over several replicas keeps all the state on each: sharding it is said; one GPU: not
    two = plan(Plan(big, devices=("l4",), gpus=(2,)))[0]
    assert "strategy fsdp shards" in two.reasons[0]
    assert "strategy fsdp" not in alone.reasons[0]
    # already sharded: nothing to say of it; the command line says each field as its flag
    sharded = plan(Plan(big, devices=("l4",), gpus=(2,), strategies="fsdp"))[0]
    assert sharded.layout.strategy == "fsdp" and "strategy fsdp" not in sharded.reasons[0]
    assert main(["plan", model, "--batch-size", str(1 << 17), "--epochs", "1", "--dataset-size",
                 "1000", "--devices", "l4", "--gpus", "2"]) == 0
    out = capsys.readouterr().out
    assert "; --global-batch searches" in out and "; --strategy fsdp shards" in out
    # `*` marks the Pareto front alone: a step past the memory is said in why not
    row = out.splitlines()[2]
    assert row.startswith("nvidia-l4 ") and "does not fit" in row and "*" not in row


def test_a_roomy_plan_lists_a_tight_step_infeasible(model, monkeypatch, capsys):
    """A scheduler that cannot afford a run that dies of memory asks for a tenth free."""
    from mdot_jax.serving import prediction

    monkeypatch.setattr(prediction, "TIGHT", 0.0)  # every step that fits is tight
    kept, roomy = (plan(Plan(_job(model), devices="l4", gpus=(1, 2), roomy=r))
                   for r in (False, True))
    assert all(o.feasible and o.prediction.tight for o in kept)
    assert [o.to_json()["iteration_ms"] for o in roomy] == [
        o.to_json()["iteration_ms"] for o in kept]  # priced alike, judged apart
    assert all(o.reasons == [f"{number(o.prediction.memory_gb)} GB per GPU may not fit in the "
                             "nvidia-l4's 24 GB (roomy: a tenth kept free)"] for o in roomy)
    with pytest.raises(RequestError, match="^roomy 'yes': true or false"):
        Plan(_job(model), roomy="yes")
    assert main(["plan", model, "--batch-size", "32", "--epochs", "1", "--dataset-size", "1000",
                 "--devices", "l4", "--gpus", "1", "--roomy"]) == 0
    assert "0 of 1 plans feasible" in capsys.readouterr().out


def test_devices_as_one_string_as_on_the_command_line(model, capsys):
    assert Plan(_job(model), devices="all").devices == ("all",)
    assert len(plan(Plan(_job(model), devices="h100-sxm,l4", gpus=(1,)))) == 2
    assert main(["plan", model, "--batch-size", "32", "--epochs", "1", "--dataset-size", "1000",
                 "--devices", "h100-sxm,l4", "--gpus", "1"]) == 0
    header = capsys.readouterr().out.splitlines()[1]
    assert "memory GB" in header and "tok/s/GPU" not in header  # no tokens: no column
    # a name several boards share: each of them, as `mdot devices h100` lists them (a plan
    # compares GPUs; it was refused as ambiguous); one the catalog lacks: its line
    assert {o.device for o in plan(Plan(_job(model), devices="h100,l4", gpus=(1,)))} == {
        "nvidia-h100-pcie", "nvidia-h100-sxm", "nvidia-h100-nvl", "nvidia-l4"}
    with pytest.raises(RequestError, match="devices: no GPU 'h1000'"):
        plan(Plan(_job(model), devices="h1000", gpus=(1,)))


def test_every_gpu_of_a_plan_is_priced_at_one_precision(model):
    """None named: fp32 on every GPU, the RTX 3090 too (whose checkpoint alone would answer at
    amp-fp16)."""
    request = Plan(_job(model, precision=None), devices="h100-sxm,rtx3090", gpus=(1,))
    assert request.priced.precision == "fp32"
    ours = {o.device: o.prediction for o in plan(request)}
    assert all("spec sheet" in p.source for p in ours.values())


def test_a_plan_says_what_it_assumed_once_and_each_option_its_own(model, capsys):
    """A plan said nothing of the precision it chose (fp32, a default LLM users read as a 7x
    slower answer) nor of any prediction's warnings: the warnings every option shares are said
    once, each option's own ride in its JSON, and a precision named is not said."""
    for precision in (None, "amp-bf16"):
        assert main(["plan", model, "--batch-size", "32", "--epochs", "3", "--dataset-size",
                     "1000", "--devices", "h100-sxm,l4", "--gpus", "1,2", "--json"]
                    + ["--precision", precision] * bool(precision)) == 0
        out, err = capsys.readouterr()
        options = json.loads(out)
        said = [line for line in err.splitlines() if line.startswith("mdot: warning: ")]
        default = [w for w in said if w.startswith("mdot: warning: precision: fp32, the default")]
        assert len(default) == (precision is None)
        assert all(any(w.startswith("precision: fp32, the default") for w in o["warnings"])
                   == (precision is None) for o in options)
        for line in said:  # shared by every option
            assert all(line.removeprefix("mdot: warning: ") in o["warnings"] for o in options)


def test_a_sequence_field_given_none_is_its_default(model):
    """JSON's null for `strategies` with a global batch raised Python's TypeError from deep in
    the search; None is each sequence field's default, as an omitted field."""
    job = _job(model)
    none = Plan(job, devices=None, gpus=None, cps=None, strategies=None, global_batch=16)
    assert (none.devices, none.gpus, none.cps, none.strategies) == (("all",), (1, 2, 4, 8), (), ())
    asked = dict(devices="h100-sxm", gpus=(1,), global_batch=16)
    assert [o.hours for o in plan(Plan(job, strategies=None, **asked))] == \
        [o.hours for o in plan(Plan(job, **asked))]


@pytest.mark.parametrize("field,value", [
    ("device", "h100-sxm"), ("device_spec", {"name": "my-gpu"}), ("checkpoint", "timm-rtx3090")])
def test_a_device_of_the_jobs_is_refused_not_ignored(model, field, value):
    """A plan prices its devices: the job's own device (or spec sheet, or checkpoint) was
    silently dropped, every catalogued GPU priced in its place."""
    for devices in ("l4", "all"):  # a device the plan names is its own (a job reused)
        with pytest.raises(RequestError, match=f"^{field}: a plan prices ") as e:
            Plan(_job(model, **{field: value}), devices=devices)
        assert e.value.field == field
    if field == "device":
        assert Plan(_job(model, device="h100-sxm"), devices="h100-sxm,l4").job.device


@pytest.mark.parametrize("strategy", [[], ["--strategy", "fsdp"]])
def test_counts_a_gpu_cannot_run_for_one_reason_share_a_row(model, capsys, strategy):
    """No bf16 on a T4: its four counts are one row, `1,2,4,8`, not four alike (under FSDP
    too, its one GPU a replica with nothing to shard, not refused for the strategy)."""
    assert main(["plan", model, "--batch-size", "32", "--epochs", "1", "--dataset-size", "1000",
                 "--precision", "amp-bf16", "--devices", "t4,l4", "--gpus", "1,2,4,8",
                 *strategy]) == 0
    rows = capsys.readouterr().out.splitlines()[2:]
    t4 = [r for r in rows if r.startswith("nvidia-t4 ")]
    assert len(t4) == 1 and t4[0].split()[1] == "1,2,4,8" and "no bf16" in t4[0]
    assert sorted(int(r.split()[1]) for r in rows if r.startswith("nvidia-l4 ")) == [1, 2, 4, 8]


def test_a_plan_needs_the_jobs_size(model):
    with pytest.raises(RequestError, match="epochs: a plan prices the whole job"):
        Plan(TrainingJob(model=model, batch_size=8))


def test_the_cli_tables_plots_and_says_json(model, tmp_path, capsys, monkeypatch):
    from mdot_jax.serving import figures

    prices = tmp_path / "prices.json"
    prices.write_text(json.dumps({"prices": PRICES}))
    args = ["plan", model, "--batch-size", "32", "--epochs", "3", "--dataset-size", "1000000",
            "--precision", "amp-bf16", "--devices", "h100-sxm,a100-sxm-80gb,l4",
            "--gpus", "1,8", "--prices", str(prices), "--deadline", "2"]
    assert main(args + ["--plot", str(tmp_path / "front.png")]) == 0
    out = capsys.readouterr().out
    assert "plans feasible" in out and "*" in out and (tmp_path / "front.png").stat().st_size
    # a plot is never replaced unasked, nor drawn without prices: said before any pricing
    before = (tmp_path / "front.png").read_bytes()
    for extra, needle in ((["--plot", str(tmp_path / "front.png")], "exists; --force"),
                          (["--plot", str(tmp_path / "no" / "f.png")], "folder does not"),
                          (["--plot", str(tmp_path / "f.png"), "--prices", ""], "give --prices"),
                          (["--plot", str(tmp_path / "f.txt")], "matplotlib writes no .txt")):
        assert main([*args, *extra]) == 2
        out, err = capsys.readouterr()
        assert needle in err and not out and err.count("\n") == 1, err
    assert (tmp_path / "front.png").read_bytes() == before
    assert main(args + ["--plot", str(tmp_path / "front.png"), "--force"]) == 0
    assert "wrote" in capsys.readouterr().out
    # none within the deadline: the nearest trade-offs named, not anonymous grey dots
    drawn = []
    monkeypatch.setattr(figures, "save", lambda fig, path: drawn.append(fig))
    assert main([*args[:-1], "0.001", "--plot", str(tmp_path / "late.png")]) == 0
    (ax,) = drawn[0].axes
    late = capsys.readouterr().out
    assert "0 of " in late and [t.get_text() for t in ax.get_legend().get_texts()] == [
        "past the deadline or the budget"]
    assert ax.texts and all(" x " in t.get_text() for t in ax.texts)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["front.png", "prices.json"]
    assert main(args + ["--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert len(rows) == 6 and {"device", "gpus", "hours", "cost_usd", "feasible"} <= set(rows[0])
    prices.write_text("[1, 2]")
    assert main(args) == 2
    assert "--prices" in capsys.readouterr().err
    prices.write_text(json.dumps({"prices": {"h100-sxm": "3.99"}}))  # the entry, by name
    assert main(args) == 2
    assert "'h100-sxm' is \"3.99\": expected a number" in capsys.readouterr().err
    # or inline, as a scheduler's script would write them: the same plan as the file's
    inline = ",".join(f"{k}={v}" for k, v in PRICES.items())
    assert main([*args[:-4], "--prices", inline, *args[-2:], "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == rows
    for given, needle in (("h100-sxm=abc", "'h100-sxm=abc': expected NAME=USD"),
                          ("l4=1,l4=2", "a device given twice")):
        assert main([*args[:-4], "--prices", given]) == 2
        assert needle in capsys.readouterr().err
    # the GPUs a scheduler has free: plans needing more listed, priced, with why
    args = [*args[:-4], "--prices", inline, *args[-2:]]
    assert main([*args, "--available", "h100-sxm=1,l4=0", "--json"]) == 0
    free = json.loads(capsys.readouterr().out)
    said = {(r["device"], r["gpus"]): r["reasons"] for r in free}
    assert said[("nvidia-h100-sxm", 8)] == ["8 GPUs: 1 free (available)"]
    assert said[("nvidia-l4", 1)][-1] == "1 GPU: 0 free (available)"
    assert not said[("nvidia-h100-sxm", 1)] and all(r["hours"] for r in free)
    # fewer free than the most asked: what is free priced too, as a scheduler would start it
    assert main([*args, "--available", "h100-sxm=6,l4=12", "--json"]) == 0
    free = json.loads(capsys.readouterr().out)
    counts = {d: sorted(r["gpus"] for r in free if r["device"] == d)
              for d in ("nvidia-h100-sxm", "nvidia-a100-sxm-80gb", "nvidia-l4")}
    assert counts == {"nvidia-h100-sxm": [1, 6, 8], "nvidia-a100-sxm-80gb": [1, 8],
                      "nvidia-l4": [1, 8]}
    six = next(r for r in free if r["gpus"] == 6)
    assert six["nodes"] == 1 and not six["reasons"] and six["hours"] < next(
        r["hours"] for r in free if r["device"] == "nvidia-h100-sxm" and r["gpus"] == 1)
    for given, needle in (("h100-sxm=1.5", "expected NAME=GPUs"),
                          ("a100=2", "available['a100']: GPU 'a100' is ambiguous")):
        assert main([*args, "--available", given]) == 2
        assert needle in capsys.readouterr().err


def test_the_shipped_example_prices_name_catalogued_gpus():
    from pathlib import Path

    from mdot_jax.gpu import catalog

    doc = json.loads((Path(__file__).resolve().parents[1] / "docs" / "prices.json").read_text())
    assert set(doc["prices"]) == set(doc["sources"])
    assert all(catalog.lookup(name) for name in doc["prices"])
    assert all("read 20" in source for source in doc["sources"].values())


@pytest.fixture(scope="module")
def decoder(tmp_path_factory):
    """A 4-layer, 4-head GPT-2: 4-way tensor parallelism at most, 4 pipeline stages at most."""
    pytest.importorskip("transformers")
    from converters import from_hf_config

    path = tmp_path_factory.mktemp("plan") / "gpt2.onnx"  # exported here: no child process
    onnx.save(from_hf_config(dict(model_type="gpt2", n_layer=4, n_embd=64, n_head=4,
                                  vocab_size=128, n_positions=64), seq_len=32), path)
    return str(path)


def test_a_global_batch_splits_each_count_every_way_the_model_takes(decoder, monkeypatch,
                                                                       capsys):
    import mdot_jax.serving.front as front

    real = front.predict

    def tight(job):  # micro-batches of 8 do not fit unless checkpointed
        p = real(job)
        if job.batch_size == 8 and job.activation_checkpointing is None:
            p.memory_gb = 99.0
        return p

    monkeypatch.setattr(front, "predict", tight)
    import mdot_jax.gpu.spec_sheet as spec_sheet

    priced, price = [], spec_sheet.price

    def counted(*a, **k):  # steps priced (the V100's refusal is not one)
        p = price(*a, **k)
        priced.append(1)
        return p

    monkeypatch.setattr(spec_sheet, "price", counted)
    job = TrainingJob(model=decoder, batch_size=8, seq_len=32, train_tokens=10**9,
                      precision="amp-bf16", optimizer="adamw")  # micro-batches of 1 to 8
    options = plan(Plan(job, devices="h100-sxm,v100", gpus=(8,), global_batch=64))
    v100 = [o for o in options if o.device == "nvidia-v100-sxm2-32gb"]  # no bf16: ruled out
    assert len(v100) == 1 and not v100[0].feasible and "no bf16" in v100[0].reasons[0]
    options = [o for o in options if o not in v100]
    splits = {(o.layout.tp, o.layout.pp) for o in options}
    # 4 heads, 4 layers, 8 GPUs
    assert splits == {(t, p) for t in (1, 2, 4) for p in (1, 2, 4) if t * p <= 8}
    for o in options:
        lay, dp = o.layout, 8 // (o.layout.tp * o.layout.pp)
        assert o.gpus == 8 and lay.micro_batch * lay.grad_accum * dp == 64
        assert o.prediction.gpus == 8 and o.feasible
        assert lay.checkpointing == ("full" if lay.micro_batch == 8 else None)
    assert [o.hours for o in options] == sorted(o.hours for o in options)
    # a step priced once for every pipeline depth built on it: (tp, micro-batch, checkpointing)
    assert len(priced) == len({(o.layout.tp, o.layout.micro_batch) for o in options}) + len(
        {o.layout.tp for o in options if o.layout.micro_batch == 8})
    assert json.loads(json.dumps(options[0].to_json()))["layout"]["tp"] == options[0].layout.tp
    assert main(["plan", decoder, "--batch-size", "2", "--seq-len", "32", "--tokens", "1e9",
                 "--devices", "h100-sxm", "--gpus", "2", "--global-batch", "4", "--top", "2"]) == 0
    table = capsys.readouterr().out.splitlines()
    assert "layout" in table[1] and re.search(r"tp\d pp\d \dx\d", table[2])
    assert "tok/s/GPU" in table[1]  # a token model's plans give tokens/s a GPU
    assert main(["plan", decoder, "--batch-size", "2", "--seq-len", "32", "--tokens", "1e9",
                 "--devices", "h100-sxm", "--gpus", "2", "--global-batch", "4", "--json"]) == 0
    first = json.loads(capsys.readouterr().out)[0]
    assert first["tokens_per_s_per_gpu"] == pytest.approx(first["tokens_per_s"] / 2)
    with pytest.raises(RequestError, match="global_batch 2: no count of GPUs asked .3.*1-8 "):
        plan(Plan(job, devices="h100-sxm", gpus=(3,), global_batch=2))  # 3 replicas at least
    with pytest.raises(RequestError, match="global_batch: searches the layouts; give no tp"):
        Plan(TrainingJob(model=decoder, batch_size=1, seq_len=32, tp=2, gpus=8,
                         train_tokens=10**9), global_batch=64)


def test_a_limit_on_the_work_refuses_a_plan_before_pricing_it(decoder, monkeypatch):
    import mdot_jax.serving.front as front

    monkeypatch.setattr(front, "predict", lambda *a, **k: pytest.fail("priced"))
    job = job_for_plan(model=decoder, seq_len=32, batch_size=4, epochs=1, dataset_size=1000,
                       precision="amp-bf16")
    with pytest.raises(RequestError, match=r"devices: \d+ layouts to price, more than the 3 a "
                       r"request may; .*, or a smaller batch_size") as e:
        plan(Plan(job, devices=("h100-sxm",), gpus=(8,), global_batch=32), limit=3)
    assert e.value.field == "devices"
    with pytest.raises(RequestError, match=r"devices: 4 candidates to price"):
        plan(Plan(job, devices=("h100-sxm", "l4"), gpus=(1, 2)), limit=3)


def test_the_search_tries_the_largest_micro_batch_a_replicas_share_takes():
    """A global batch of 7 on one GPU was searched at micro-batches of 1 alone (powers of two
    and the batch size, 8, divide none of it): 7 steps an update where one would do."""
    from mdot_jax.serving.plan import layouts

    one = layouts(1, 1, global_batch=7, micro_batch=8)
    assert {(lay.micro_batch, lay.grad_accum) for lay in one} == {(1, 7), (7, 1)}
    for lay in layouts(8, 1, global_batch=96, micro_batch=8):
        assert lay.micro_batch * lay.grad_accum * 8 // (lay.tp * lay.pp) == 96
    dp8 = {lay.micro_batch for lay in layouts(8, 1, 96, 8) if lay.tp * lay.pp == 1}
    assert dp8 == {1, 2, 4, 6}  # a share of 12: 6 its largest under 8


def test_a_global_batch_no_replicas_share_says_so_beside_the_split_refused(tmp_path):
    """A CNN's global batch of 100 over 8 GPUs: only tensor-parallel splits divide it, which a
    model without layers refuses; the reason says both."""
    onnx.save(conv_bn_relu(), tmp_path / "cnn.onnx")
    options = plan(Plan(_job(str(tmp_path / "cnn.onnx"), batch_size=64), devices="h100-sxm",
                        gpus=(8,), global_batch=100))
    assert len(options) == 1 and not options[0].feasible
    why = options[0].reasons[0]
    assert why.startswith("a global batch of 100 does not split into whole micro-batches of "
                          "1-64 over 8 data-parallel replicas, and tp: ")


def test_a_split_some_counts_cannot_take_lists_them_infeasible(decoder, capsys):
    """`--tp 2 --gpus 1,2,4`: the single GPU is listed with its reason, the others priced (the
    command line's job is not refused for the count that cannot take the split)."""
    assert main(["plan", decoder, "--batch-size", "2", "--seq-len", "32", "--tokens", "1e4",
                 "--devices", "h100-sxm", "--gpus", "1,2,4", "--tp", "2",
                 "--strategy", "fsdp"]) == 0
    rows = {int(line.split()[1]): line for line in capsys.readouterr().out.splitlines()[2:]}
    assert set(rows) == {1, 2, 4}
    assert "--tp x --pp (2 x 1) does not divide 1 GPUs" in rows[1]  # said as flags
    assert "<0.001" in rows[4]  # a seconds-long job in hours, not 8.1e-05

    job = job_for_plan(model=decoder, batch_size=2, seq_len=32, train_tokens=10**4, tp=2, ep=1)
    options = plan(Plan(job, devices="h100-sxm", gpus=(1, 4)))
    assert [o.gpus for o in options if o.feasible] == [4]
    with pytest.raises(RequestError, match="tp 'x'"):  # the job's own error, not a TypeError
        job_for_plan(model=decoder, batch_size=2, tp="x")
    cut = plan(Plan(job_for_plan(model=decoder, batch_size=2, seq_len=32, train_tokens=10**4,
                                 cp=2), devices="h100-sxm", gpus=(1, 2)))  # context parallel
    assert [o.gpus for o in cut if o.feasible] == [2] and cut[0].prediction.cp == 2
    assert "tp x pp x cp (1 x 1 x 2) does not divide 1 GPUs" in cut[1].reasons[0]
    searched = plan(Plan(job_for_plan(model=decoder, batch_size=2, seq_len=32, cp=2,
                                      train_tokens=10**4), devices="h100-sxm", gpus=(4,),
                         global_batch=4))  # the job's cp kept, the rest searched
    assert searched and all(o.layout.cp == 2 and o.prediction.cp == 2 and "cp2" in str(o.layout)
                            for o in searched)
    assert all(o.layout.micro_batch * o.layout.grad_accum * o.prediction.replicas == 4
               for o in searched)


def test_the_layout_search_tries_each_context_parallel_degree_asked(decoder, capsys):
    """`--global-batch 4 --cp 1,2,4 --gpus 4`: layouts with and without context parallelism,
    each priced on the model cut to its sequence (cp 4 on a 32-token sequence: 4 tokens a
    GPU); several degrees without the search, or beside the job's own cp, are one error."""
    job = job_for_plan(model=decoder, batch_size=2, seq_len=32, train_tokens=10**4)
    options = plan(Plan(job, devices="h100-sxm", gpus=(4,), global_batch=4, cps=(1, 2, 4, 2)))
    cps = {o.layout.cp for o in options if o.prediction is not None}
    assert cps == {1, 2, 4}
    assert all(o.prediction.cp == o.layout.cp and o.layout.tp * o.layout.pp * o.layout.cp
               * o.prediction.replicas == 4 for o in options if o.prediction is not None)
    keys = [(str(o.layout), o.gpus) for o in options]
    assert len(keys) == len(set(keys))  # cp 2 asked twice, priced once
    for fields, needle in ((dict(cps=(1, 2)), "give global_batch"),
                           (dict(cps=(1, 2), global_batch=4, job=dataclasses.replace(job, cp=2,
                                                                                     gpus=2)),
                            "no cp of the job's")):
        with pytest.raises(RequestError, match=needle) as e:
            Plan(**{"job": job, "devices": "h100-sxm", **fields})
        assert e.value.field == "cps"
    assert main(["plan", decoder, "--batch-size", "2", "--seq-len", "32", "--tokens", "1e4",
                 "--devices", "h100-sxm", "--gpus", "4", "--cp", "1,2"]) == 2
    assert "--cp 1,2: several context-parallel degrees" in capsys.readouterr().err
    assert main(["plan", decoder, "--batch-size", "2", "--seq-len", "32", "--tokens", "1e4",
                 "--devices", "h100-sxm", "--gpus", "4", "--global-batch", "4",
                 "--cp", "1,2"]) == 0
    assert " cp2 " in capsys.readouterr().out
    with pytest.raises(RequestError, match="with context parallelism over 3 or 5 GPUs$"):
        plan(Plan(job, devices="h100-sxm", gpus=(4,), global_batch=4, cps=(3, 5)))
    # a degree no count asked divides, beside one that does: a row says so (it was dropped)
    options = plan(Plan(job, devices="h100-sxm", gpus=(4,), global_batch=4, cps=(1, 3)))
    assert [o.reasons for o in options if o.prediction is None] == [[
        "cp 3: no count asked (4) splits into whole micro-batches of 1-2 per data-parallel "
        "replica with context parallelism over 3 GPUs"]]


def test_a_context_parallel_degree_the_model_refuses_is_said_not_dropped(tmp_path):
    """`--cp 1,2` on a CLIP (its images are cut by no ring): the cp 2 layouts were left out
    without a word, the plan reading as if cp 2 had been priced and lost; a row says why."""
    from test_hf_heads import CLIP

    (tmp_path / "config.json").write_text(json.dumps(CLIP))
    job = job_for_plan(model=str(tmp_path / "config.json"), batch_size=2, seq_len=16,
                       train_tokens=10**4)
    options = plan(Plan(job, devices="h100-sxm", gpus=(2,), global_batch=4, cps=(1, 2)))
    assert {o.layout.cp for o in options if o.prediction is not None} == {1}
    [said] = [o for o in options if o.prediction is None]
    assert said.device == "nvidia-h100-sxm" and not said.feasible
    assert said.reasons == ["cp 2: the model trains on images or audio, which no ring cuts; "
                            "context parallelism is priced for language models alone"]


def test_the_layout_search_tries_each_strategy_asked_and_keeps_the_best(decoder, capsys):
    """`--global-batch 8 --strategies ddp,fsdp,hsdp` on 2 nodes of 4: each layout with replicas
    to shard over priced under each strategy, the best kept; a layout without replicas as DDP;
    a strategy the job cannot take (Muon's sharded ones) left out, not the layout. Without the
    search, or beside the job's own strategy, one error."""
    job = job_for_plan(model=decoder, batch_size=2, seq_len=32, train_tokens=10**4, nodes=2,
                       network_gbs=1.0)
    kw = dict(devices="h100-sxm", gpus=(4,), global_batch=8)
    each = {s: plan(Plan(job, **kw, strategies=(s,))) for s in ("ddp", "fsdp", "hsdp")}
    best = plan(Plan(job, **kw, strategies="ddp,fsdp,hsdp"))

    def by_split(options):
        return {(o.layout.tp, o.layout.pp, o.layout.micro_batch): o for o in options
                if o.prediction is not None}

    alone = {s: by_split(o) for s, o in each.items()}
    for split, o in by_split(best).items():
        assert o.layout.strategy == min(alone, key=lambda s: (
            alone[s][split].hours if split in alone[s] else math.inf))
        assert o.hours == pytest.approx(alone[o.layout.strategy][split].hours)
        if o.prediction.replicas == 1:
            assert o.layout.strategy == "ddp"
    assert {o.layout.strategy for o in best if o.prediction is not None} >= {"ddp", "hsdp"}
    assert any(str(o.layout).endswith(" hsdp") for o in best)
    muon = plan(Plan(dataclasses.replace(job, optimizer="muon", precision="amp-bf16"), **kw,
                     strategies=("fsdp", "ddp")))  # Muon is priced with DDP alone
    assert muon and {o.layout.strategy for o in muon if o.prediction is not None} == {"ddp"}
    for fields, needle in ((dict(strategies=("fsdp",), global_batch=8,
                                 job=dataclasses.replace(job, strategy="zero1")),
                            "no strategy of the job's"),
                           (dict(strategies="ddp,tp", global_batch=8), "strategies 'tp'")):
        with pytest.raises(RequestError, match=needle) as e:
            Plan(**{"job": job, "devices": "h100-sxm", **fields})
        assert e.value.field == "strategies"
    assert main(["plan", decoder, "--batch-size", "2", "--seq-len", "32", "--tokens", "1e4",
                 "--devices", "h100-sxm", "--gpus", "4", "--nodes", "2", "--global-batch", "8",
                 "--strategies", "ddp,hsdp", "--network-gbs", "1"]) == 0
    assert " hsdp " in capsys.readouterr().out


def test_a_plan_without_the_search_tries_each_strategy_on_each_count(decoder, capsys):
    """`--strategies ddp,fsdp` without `--global-batch`: each GPU count priced under each
    strategy at the job's own split and batch, the best kept and named in the layout column;
    one GPU as DDP."""
    job = job_for_plan(model=decoder, batch_size=2, seq_len=32, train_tokens=10**4)
    kw = dict(devices="h100-sxm", gpus=(1, 4))
    alone = {s: {o.gpus: o for o in plan(Plan(dataclasses.replace(job, strategy=s), **kw))
                 if o.prediction is not None} for s in ("ddp", "fsdp")}
    best = {o.gpus: o for o in plan(Plan(job, **kw, strategies="ddp,fsdp"))}
    assert set(best) == {1, 4} and best[1].layout.strategy == "ddp"
    assert best[1].hours == pytest.approx(alone["ddp"][1].hours)
    s = min(alone, key=lambda s: alone[s][4].hours)
    assert best[4].layout.strategy == s and best[4].hours == pytest.approx(alone[s][4].hours)
    assert main(["plan", decoder, "--batch-size", "2", "--seq-len", "32", "--tokens", "1e4",
                 "--devices", "h100-sxm", "--gpus", "4", "--strategies", "ddp,fsdp"]) == 0
    out = capsys.readouterr().out
    assert "layout" in out and f"tp1 pp1 2x1{'' if s == 'ddp' else ' ' + s}" in out


def test_a_scheduler_plans_from_the_package_top():
    import mdot_jax
    from mdot_jax.serving import plan as planning

    assert (mdot_jax.Plan, mdot_jax.plan) == (planning.Plan, planning.plan)
    assert all(getattr(mdot_jax, name) is not None for name in mdot_jax.__all__)


def test_costs_or_times_no_prediction_tells_apart_rank_by_the_other():
    from mdot_jax.serving.plan import Option, _rank

    def ranked(*options):
        return [(o.gpus, o.hours) for o in sorted(options, key=_rank)]

    def option(gpus, hours, cost=None, reasons=()):
        return Option("g", gpus, object(), hours, cost, list(reasons))  # a prediction stands in

    # no prices: 4 pipeline stages of one micro-batch take what 1 GPU does
    assert ranked(option(4, 3.26), option(8, 3.26), option(1, 3.27), option(2, 3.4),
                  option(1, 0.5, reasons=["over the deadline"]),
                  option(2, None, reasons=["tp 3 does not divide 2 GPUs"])) == [
        (1, 3.27), (4, 3.26), (8, 3.26), (2, 3.4), (1, 0.5), (2, None)]
    assert ranked(option(4, 3.0), option(1, 3.1)) == [(4, 3.0), (1, 3.1)]  # 3% sooner
    # 8 GPUs scaling all but perfectly cost what 1 does: the sooner first; priced before not
    assert ranked(option(1, 2.86, 8.55), option(8, 0.36, 8.61), option(4, 0.1)) == [
        (8, 0.36), (1, 2.86), (4, 0.1)]
    assert ranked(option(1, 2.86, 8.55), option(8, 0.36, 9.0)) == [(1, 2.86), (8, 0.36)]
