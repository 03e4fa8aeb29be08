"""`mdot serve` with a real client: the service started on a free port, exercised with httpx
(upload, predict, plan, concurrent requests, malformed JSON, a huge upload, an unknown device);
its answers are the CLI's."""

import json
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import onnx
import pytest
from onnx_builders import attention

from mdot_jax.cli import main
from mdot_jax.options import PRECISIONS, STRATEGIES
from mdot_jax.serving.service import JOB_FIELDS, MAX_PLAN, PLAN_FIELDS, Answers

httpx = pytest.importorskip("httpx")
uvicorn = pytest.importorskip("uvicorn")
pytest.importorskip("fastapi")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """The service on a free port of 127.0.0.1 (uploads limited to 0.05 MB), and a model."""
    from mdot_jax.serving.service import create_app

    root = tmp_path_factory.mktemp("serve")
    onnx.save(attention(seq=64, dim=64), root / "attn.onnx")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    config = uvicorn.Config(create_app(root / "cache", max_upload_mb=0.05, max_models=2),
                            host="127.0.0.1", port=port, log_level="warning")
    srv = uvicorn.Server(config)
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    for _ in range(200):
        if srv.started:
            break
        time.sleep(0.05)
    client = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60)
    yield client, root
    client.close()
    srv.should_exit = True
    thread.join(10)
    from mdot_jax.serving import model_source

    model_source.SEQUENCE_CACHE.clear()  # the service's disk cache is its process's; not the tests'
    model_source._converted.cache_clear()


def _upload(client, path) -> str:
    r = client.post("/v1/models", content=path.read_bytes(),
                    headers={"content-type": "application/octet-stream"})
    assert r.status_code == 200, r.text
    return r.json()["model"]


def test_health_devices_and_schema(server):
    client, _ = server
    assert client.get("/healthz").json()["status"] == "ok"
    names = {d["name"] for d in client.get("/v1/devices").json()}
    assert "nvidia-h100-sxm" in names and len(names) >= 20
    paths = client.get("/openapi.json").json()["paths"]
    assert {"/v1/models", "/v1/predict", "/v1/plan", "/v1/devices", "/healthz"} <= set(paths)
    body = {k: paths[f"/v1/{k}"]["post"]["requestBody"]["content"]["application/json"]["schema"]
            for k in ("predict", "plan")}
    job, plan = (body[k]["properties"] for k in ("predict", "plan"))
    # every field the service takes is typed and described, its values listed where chosen
    assert set(job) == {"model", *JOB_FIELDS} and set(plan) == {"model", *JOB_FIELDS, *PLAN_FIELDS}
    assert all(v["description"] for v in plan.values())
    assert job["precision"]["anyOf"] == [{"type": "string", "enum": list(PRECISIONS)},
                                         {"type": "null"}]
    assert job["grad_accum"] == dict(job["grad_accum"], type="integer", default=1)
    assert plan["strategies"]["items"]["enum"] == list(STRATEGIES)
    assert job["gpus"]["default"] == 1 and plan["gpus"]["default"] == [1, 2, 4, 8]  # the plan's
    assert {"type": "string"} not in job["device_spec"]["anyOf"]  # no file of the server's
    answer, planned = (paths[f"/v1/{k}"]["post"]["responses"]["200"]["content"][
        "application/json"]["schema"] for k in ("predict", "plan"))
    one, several = answer["anyOf"]
    assert several["items"] == one and {"iteration_ms", "mfu", "memory_tight"} <= set(
        one["properties"])
    option = planned["items"]["properties"]
    assert all(v.get("description") for v in option.values()) and "prediction" not in option
    assert set(option["layout"]["anyOf"][0]["properties"]) >= {"tp", "pp", "micro_batch"}


def test_predict_answers_as_the_cli(server, capsys):
    client, root = server
    sha = _upload(client, root / "attn.onnx")
    assert _upload(client, root / "attn.onnx") == sha  # one model, one name
    job = {"model": sha, "batch_size": 8, "device": "h100-sxm", "precision": "amp-bf16",
           "gpus": [1, 8]}
    got = client.post("/v1/predict", json=job)
    assert got.status_code == 200, got.text
    assert main(["predict", str(root / "attn.onnx"), "--batch-size", "8", "--device",
                 "h100-sxm", "--precision", "amp-bf16", "--gpus", "1,8", "--json"]) == 0
    cli = json.loads(capsys.readouterr().out)
    assert [r["iteration_ms"] for r in got.json()] == [r["iteration_ms"] for r in cli]
    assert [r["memory_gb"] for r in got.json()] == [r["memory_gb"] for r in cli]
    # one prediction that does not fit: what would, as the CLI says it
    big = dict(job, batch_size=1 << 19, gpus=2, device="l4")
    got = client.post("/v1/predict", json=big)
    assert got.status_code == 200, got.text
    assert main(["predict", str(root / "attn.onnx"), "--batch-size", str(1 << 19), "--device",
                 "l4", "--precision", "amp-bf16", "--gpus", "2", "--json"]) == 0
    cli = json.loads(capsys.readouterr().out)
    assert got.json()["fits_with"] == cli["fits_with"] and cli["fits_with"]
    assert all(f["memory_gb"] <= cli["memory_limit_gb"] < cli["memory_gb"]
               for f in cli["fits_with"])


def test_plan_ranks_the_devices(server):
    client, root = server
    sha = _upload(client, root / "attn.onnx")
    r = client.post("/v1/plan", json={
        "model": sha, "batch_size": 8, "epochs": 1, "dataset_size": 10000,
        "devices": ["h100-sxm", "a100-sxm-80gb", "l4"], "gpus": [1, 2],
        "prices": {"h100-sxm": 3.99, "a100-sxm-80gb": 2.79}, "budget_usd": 1e6,
        "available": {"h100-sxm": 1}})
    assert r.status_code == 200, r.text
    rows = r.json()
    assert [row["reasons"] for row in rows if row["device"] == "nvidia-h100-sxm"
            and row["gpus"] == 2] == [["2 GPUs: 1 free (available)"]]
    body = client.get("/openapi.json").json()["paths"]["/v1/plan"]["post"]["requestBody"]
    assert "GPUs free by device" in json.dumps(body)
    described = client.get("/openapi.json").json()["paths"]["/v1/plan"]["post"]["responses"]
    keys = described["200"]["content"]["application/json"]["schema"]["items"]["properties"]
    assert all(set(row) <= set(keys) for row in rows)  # every key the answer has, described
    assert len(rows) == 6 and rows[0]["feasible"] and rows[0]["cost_usd"] is not None
    assert not rows[-1]["feasible"] and "no price" in rows[-1]["reasons"][0]  # the L4's
    r = client.post("/v1/plan", json={  # every split of 2 GPUs into a global batch of 8
        "model": sha, "batch_size": 4, "epochs": 1, "dataset_size": 10000,
        "devices": ["h100-sxm"], "gpus": [2], "global_batch": 8})
    assert r.status_code == 200, r.text
    layouts = [row["layout"] for row in r.json()]
    assert all(set(row) <= set(keys) for row in r.json())
    assert layouts and all(x["pp"] == 1 for x in layouts)  # one block: no pipeline
    assert all(x["micro_batch"] * x["grad_accum"] * 2 // (x["tp"] * x["pp"]) == 8
               for x in layouts)
    r = client.post("/v1/plan", json={  # context parallelism the model (no token ids) refuses
        "model": sha, "batch_size": 4, "epochs": 1, "dataset_size": 10000,
        "devices": ["h100-sxm"], "gpus": [2], "global_batch": 8, "cps": [1, 2]})
    assert r.status_code == 200, r.text
    assert {row["layout"]["cp"] for row in r.json() if "layout" in row} == {1}
    [said] = [row for row in r.json() if "layout" not in row]  # cp 2, said, not dropped
    assert not said["feasible"] and said["reasons"][0].startswith("cp")
    r = client.post("/v1/plan", json={"model": sha, "batch_size": 4, "epochs": 1,
                                      "dataset_size": 10000, "cps": [1, 2]})
    assert r.status_code == 422 and r.json()["field"] == "cps", r.text
    r = client.post("/v1/plan", json={"model": sha, "batch_size": 4, "epochs": 1,
                                      "dataset_size": 10000, "devices": ["h100-sxm"],
                                      "gpus": [2], "global_batch": 8,
                                      "strategies": ["ddp", "zero1"]})
    assert r.status_code == 200 and {row["layout"]["strategy"] for row in r.json()} <= {
        "ddp", "zero1"}, r.text
    r = client.post("/v1/plan", json={"model": sha, "batch_size": 4, "epochs": 1,
                                      "dataset_size": 10000, "devices": ["h100-sxm"],
                                      "gpus": [1, 2], "strategies": ["fsdp"]})
    assert r.status_code == 200 and [row["layout"]["strategy"] for row in sorted(
        r.json(), key=lambda row: row["gpus"])] == ["ddp", "fsdp"], r.text  # one GPU: DDP
    r = client.post("/v1/plan", json={"model": sha, "batch_size": 4, "deadline_hours": 3})
    for field, value in (("device", "h100-sxm"), ("device_spec", {"name": "my-gpu"})):
        r2 = client.post("/v1/plan", json={"model": sha, "batch_size": 4, "epochs": 1,
                                           "dataset_size": 10000, field: value})
        assert r2.status_code == 422 and r2.json()["field"] == field, r2.text  # not ignored
    said = r.json()["error"]  # the fields a plan takes, each once (gpus: the job and the plan)
    assert r.status_code == 422 and "did you mean deadline_h?" in said and said.count(" gpus,") == 1
    r = client.post("/v1/plan", json={"model": sha, "batch_size": 4, "epochs": 1,
                                      "dataset_size": 10000, "strategy": "zero1",
                                      "strategies": ["fsdp"]})
    assert r.status_code == 422 and r.json()["field"] == "strategies", r.text
    r = client.post("/v1/plan", json={  # a count the split does not divide: listed, not a 422
        "model": sha, "batch_size": 8, "epochs": 1, "dataset_size": 10000, "tp": 2,
        "devices": ["h100-sxm"], "gpus": [1, 2]})
    assert r.status_code == 200, r.text
    reasons = {row["gpus"]: row["reasons"][0] for row in r.json()}
    assert "tp x pp (2 x 1) does not divide 1 GPUs" in reasons[1]
    assert "1 attention heads" in reasons[2]  # the model's own refusal
    r = client.post("/v1/plan", json={  # a request's work is bounded: said before pricing
        "model": sha, "batch_size": 4, "epochs": 1, "dataset_size": 10000, "devices": "all",
        "gpus": list(range(1, 33)), "strategies": ["ddp", "zero1"]})
    assert r.status_code == 422 and r.json()["field"] == "devices", r.text
    n = len(client.get("/v1/devices").json()) * 32 * 2
    assert r.json()["error"].startswith(f"devices: {n:,} candidates to price, more than the "
                                        f"{MAX_PLAN:,} a request may; name fewer"), r.text


@pytest.mark.parametrize("body,status,field,needle", [
    ("{not json", 400, "", "not JSON"),
    ('["a list"]', 400, "", "a JSON object"),
    ({"batch_size": 8, "model": None}, 422, "model", "the SHA-256"),
    ({"batch_size": 8, "model": "0" * 64}, 404, "model", "not uploaded here"),
    ({"batch_size": "8"}, 422, "batch_size", "expected a positive integer"),
    ({"batch_size": 8, "device": "h1000"}, 422, "", "h1000"),
    ({"batch_size": 8, "colour": "blue"}, 422, "colour", "not a field (the fields: model, "),
    ({"batch_size": 8, "tokens": 10**9}, 422, "tokens",  # the CLI's --tokens
     "tokens: not a field; did you mean train_tokens?"),
    # a field the request does not take is said before a model it lacks (a plan's nested job)
    ('{"job": {"model": "gpt2"}}', 422, "job", "job: not a field"),
    ('{"batch_size": 8}', 422, "model", "model: missing"),
    ({"batch_size": 8, "tp": 3, "gpus": 4, "device": "h100-sxm"}, 422, "tp", "does not divide"),
    # the server's own files and folders are never read by a name a request gives
    ({"batch_size": 8, "device_spec": "/etc/passwd"}, 422, "device_spec", "a JSON object"),
    ({"batch_size": 8, "checkpoint": "/etc"}, 422, "checkpoint", "the name of a shipped"),
    ({"batch_size": 8, "device_spec": {"name": "x"}}, 422, "device_spec",
     "device_spec: missing field"),
    ('{"model": "SHA", "batch_size": 8, "batch_size": 64}', 400, "batch_size", "given twice"),
    # each value of a list is priced: 60,000 batch sizes in 256 KB were an hour's work
    ({"batch_size": list(range(1, 66))}, 422, "batch_size", "65 values; at most 64"),
])
def test_bad_input_is_a_4xx_with_one_line(server, body, status, field, needle):
    client, root = server
    if isinstance(body, dict):  # the uploaded model unless the case names its own
        body = json.dumps({"model": _upload(client, root / "attn.onnx"), **body})
    elif "SHA" in body:
        body = body.replace("SHA", _upload(client, root / "attn.onnx"))
    r = client.post("/v1/predict", content=body, headers={"content-type": "application/json"})
    assert r.status_code == status, r.text
    answer = r.json()
    assert needle in answer["error"] and "\n" not in answer["error"]
    assert "Traceback" not in r.text and (not field or answer["field"] == field)
    assert str(root) not in answer["error"]  # the server's folders are its own


def test_a_gpu_the_catalog_lacks_is_described_in_the_request(server):
    client, root = server
    sha = _upload(client, root / "attn.onnx")
    from mdot_jax.gpu import catalog

    spec = dict(catalog.find("h100-sxm").to_json(), name="my-gpu", aliases=[])
    r = client.post("/v1/predict", json={"model": sha, "batch_size": 2, "device_spec": spec})
    assert r.status_code == 200 and r.json()["device"] == "my-gpu", r.text
    same = client.post("/v1/predict", json={"model": sha, "batch_size": 2,
                                            "device": "h100-sxm"}).json()
    assert r.json()["iteration_ms"] == pytest.approx(same["iteration_ms"])
    # `mdot devices --json NAME` writes a list of one: pasted as it is, read as its one
    listed = client.post("/v1/predict", json={"model": sha, "batch_size": 2,
                                              "device_spec": [spec]})
    assert listed.status_code == 200 and listed.json() == r.json(), listed.text
    two = client.post("/v1/predict", json={"model": sha, "batch_size": 2,
                                           "device_spec": [spec, spec]})
    assert two.status_code == 422 and len(two.json()["error"]) < 200, two.text


def test_a_conversion_error_names_the_model_not_the_servers_file(server):
    client, root = server
    sha = _upload(client, root / "attn.onnx")
    r = client.post("/v1/predict", json={"model": sha, "batch_size": 2, "seq_len": 16})
    assert r.status_code == 422, r.text
    # in the request's words: its field, not the CLI's flag
    assert r.json()["error"].startswith(f"model {sha}: seq_len 16 does not apply"), r.text
    assert r.json()["field"] == "seq_len" and "--" not in r.json()["error"]
    r = client.post("/v1/predict", json={"model": sha, "batch_size": 2,
                                         "input_shapes": {"y": [2, 8, 16]}})
    assert r.status_code == 422 and r.json()["field"] == "input_shapes", r.text
    assert "input_shapes names unknown input(s) ['y']" in r.json()["error"]


def test_uploads_are_checked_and_limited(server):
    client, _ = server
    for junk in (b"not an onnx file", b'{"hidden_size": 8}'):  # a JSON without model_type
        r = client.post("/v1/models", content=junk)
        assert r.status_code == 422 and "neither an ONNX file nor" in r.json()["error"]
    r = client.post("/v1/models", content=b"x" * 200_000)  # over the 0.05 MB limit
    assert r.status_code == 413 and "over the limit" in r.json()["error"]


@pytest.mark.slow
def test_a_config_json_is_a_model_at_the_requests_tokens(server):
    """A scheduler's LLM jobs by their config.json: uploaded once, priced at `seq_len`."""
    client, _ = server
    config = dict(model_type="gpt2", n_layer=2, n_embd=64, n_head=4, n_positions=128,
                  vocab_size=512)
    sha = client.post("/v1/models", content=json.dumps(config).encode()).json()["model"]
    job = {"model": sha, "batch_size": 2, "device": "h100-sxm", "precision": "amp-bf16"}
    r = client.post("/v1/predict", json=dict(job, seq_len=128))
    assert r.status_code == 200 and r.json()["tokens_per_s"] > 0, r.text
    r = client.post("/v1/predict", json=job)
    assert r.status_code == 422 and r.json()["field"] == "seq_len"
    r = client.post("/v1/predict", json=dict(job, model="gpt2", seq_len=64))  # a named one
    assert r.status_code == 200 and r.json()["parameters"] == 124_439_808, r.text


def test_a_named_model_needs_no_upload(server):
    """GET /v1/models lists the shipped configs; "model" takes a name as it takes a SHA."""
    client, _ = server
    names = [m["name"] for m in client.get("/v1/models").json()]
    assert "llama-3.1-8b" in names
    job = {"model": "meta-llama/Llama-3.1-8B", "batch_size": 1, "device": "h100-sxm"}
    r = client.post("/v1/predict", json=job)  # priced at seq_len tokens: none given
    assert r.status_code == 422 and r.json()["field"] == "seq_len", r.text
    r = client.post("/v1/predict", json=dict(job, model="llama-9"))
    assert r.status_code == 422 and "a name GET /v1/models lists" in r.json()["error"]


def test_concurrent_clients_get_the_same_answers(server):
    client, root = server
    sha = _upload(client, root / "attn.onnx")
    job = {"model": sha, "batch_size": 8, "device": "h100-sxm"}

    def ask(_):
        r = client.post("/v1/predict", json=job)
        return r.status_code, r.json()["iteration_ms"]
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(ask, range(24)))
    assert {a[0] for a in answers} == {200} and len({a[1] for a in answers}) == 1


def test_a_port_in_use_is_one_line(tmp_path):
    from mdot_jax import MdotError
    from mdot_jax.serving.service import run

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        with pytest.raises(MdotError, match="^--port .*cannot listen on 127.0.0.1"):
            run(port=s.getsockname()[1], cache_dir=str(tmp_path))
    # a host no interface has is the host's fault, not the port's
    with pytest.raises(MdotError, match="^--host 999.1.1.1: cannot listen"):
        run(host="999.1.1.1", port=8000, cache_dir=str(tmp_path))


def test_converted_sequences_outlive_the_process_on_disk(tmp_path):
    """The service keeps each size's sequence in its cache folder: read back, not converted."""
    from mdot_jax.serving import front, model_source

    onnx.save(attention(seq=64, dim=64), tmp_path / "m.onnx")
    saved = dict(model_source.SEQUENCE_CACHE)
    try:
        model_source.keep_sequences(tmp_path / "seqs", limit=1)
        job = dict(model=str(tmp_path / "m.onnx"), device="h100-sxm")
        first = front.predict(front.TrainingJob(batch_size=8, **job))
        model_source._converted.cache_clear()  # as a restarted process
        again = front.predict(front.TrainingJob(batch_size=8, **job))
        assert again.iteration_ms == first.iteration_ms
        assert len(list((tmp_path / "seqs").glob("*.npz"))) == 1
        front.predict(front.TrainingJob(batch_size=16, **job))
        assert len(list((tmp_path / "seqs").glob("*.npz"))) == 1  # bounded
    finally:
        model_source.SEQUENCE_CACHE.clear()
        model_source.SEQUENCE_CACHE.update(saved)
        model_source._converted.cache_clear()


def test_eviction_takes_only_the_caches_own_files(tmp_path):
    from mdot_jax.serving.service import ModelStore
    from mdot_jax.writers import evict as _evict

    kept = ["0" * 32 + ".npz", "1" * 32 + ".npz"]
    theirs = ["a.npz", "model.onnx", ".c.npz.tmp-1234.npz", "2" * 32 + ".npz.bak"]
    for name in kept + theirs:
        (tmp_path / name).write_bytes(b"x")
    _evict(tmp_path, ".npz", 0)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(theirs)
    # `mdot serve --cache-dir .` beside a user's models/: uploads never evict theirs
    (tmp_path / "models").mkdir()
    for i in range(3):
        (tmp_path / "models" / f"mine-{i}.onnx").write_bytes(b"x")
    store = ModelStore(tmp_path / "models", limit=1)
    first = store.put(attention(seq=8, dim=8).SerializeToString())
    second = store.put(b'{"model_type": "gpt2"}')
    assert {p.name for p in (tmp_path / "models").iterdir()} == {
        f"mine-{i}.onnx" for i in range(3)} | {f"{second}.json"}  # one limit for both kinds
    assert first != second


def test_concurrent_clients_of_new_sizes_all_answered(server):
    """Distinct sizes at once: each converted, kept on disk and evicted beside the others."""
    client, root = server
    sha = _upload(client, root / "attn.onnx")

    def ask(n):
        r = client.post("/v1/predict", json={"model": sha, "batch_size": 1 + n,
                                             "device": "h100-sxm"})
        return r.status_code
    with ThreadPoolExecutor(8) as pool:
        assert set(pool.map(ask, range(24))) == {200}


def test_answers_kept_are_bounded_by_count_and_by_bytes():
    """Answers were kept 4,096 deep whatever their size: a plan's JSON is up to a megabyte,
    gigabytes in all for a scheduler asking many plans. Now by count and by bytes, least
    recently used first out; one answer larger than the bound is not kept."""
    kept = Answers(count=3, nbytes=10)
    for k in "abc":
        kept.put(k, b"xx")
    assert kept.get("a") == b"xx"  # now the most recently used
    kept.put("d", b"xx")  # a fourth: the least recently used (b) goes
    assert kept.get("b") is None and all(kept.get(k) for k in "acd")
    kept.put("e", b"xxxxxx")  # 12 bytes: the oldest go until 10 hold
    assert kept.held <= 10 and kept.get("e") == b"xxxxxx" and kept.get("a") is None
    kept.put("f", b"x" * 11)  # over the bound alone: not kept, nothing else lost
    assert kept.get("f") is None and kept.get("e") == b"xxxxxx"
    kept.put("e", b"y")  # replaced: its old bytes no longer counted
    assert kept.held == sum(len(kept.get(k) or b"") for k in "abcdef")
