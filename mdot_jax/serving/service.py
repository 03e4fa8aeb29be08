"""`mdot serve`: the front door over HTTP (FastAPI on uvicorn), for schedulers.

    POST /v1/models    an ONNX file's or a language model's config.json's bytes -> {"model": its
                       SHA-256}; kept on disk
    GET  /v1/models    the named models (`named_models`): "model" takes a name as a SHA
    POST /v1/predict   {"model": SHA, <TrainingJob fields>} -> a prediction (a list for several)
    POST /v1/plan      {"model": SHA, "devices", "gpus", "prices", "deadline_h", "budget_usd",
                        "global_batch", "cps", "strategies", "roomy", "available",
                        <TrainingJob fields>}
                       -> the ranked plans
    GET  /v1/devices   the GPU catalog
    GET  /healthz      {"status": "ok", "version"}
The schema is at /openapi.json (and /docs): every field of a request and of an answer typed
and described from the request and answer types (`schema`). The rules:
- a model is uploaded once and named by the SHA-256 of its bytes afterwards; the files live in
  `cache_dir/models` (written to a temporary name and renamed, so concurrent uploads of one
  model are safe), at most `max_models` of them (the least recently used go first; no file
  the store did not name by a hash is ever removed); its
  converted sequences, per size, in memory and in `cache_dir/sequences`
  (`front.keep_sequences`, bounded the same way);
- a request is the same `TrainingJob` as the Python API, with the same checks, but the
  service reads no file or folder of its own that a request names: `device_spec` is the GPU's
  spec as a JSON object (kept in `cache_dir/specs`), `checkpoint` a shipped one's name; a bad
  field is a 422 whose body is `{"error": one line, "field": its name}`; malformed JSON a 400; an
  unknown model a 404; a body over the limit (`max_upload_mb` for models, `MAX_JSON_KB` for
  requests) a 413, a list field of more than `MAX_LIST` values or a plan of more than
  `MAX_PLAN` candidates or layouts to price a 422 (a request's work bounded); nothing answers
  with a traceback;
- answers are the `to_json` of `Prediction` and `plan.Option`, numbers as the CLI prints them;
  a single prediction that does not fit carries what would (`fits.suggest`, `fits_with`);
  the last `ANSWERS` are kept by request body, as JSON, at most `ANSWER_MB` of them (a
  repeated request is not priced again; a plan's answer can be a megabyte), the checkpoints
  and step models stay loaded.
"""

import dataclasses
import hashlib
import json
import os
import re
import threading
import uuid
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mdot_jax import writers
from mdot_jax.errors import MdotError, RequestError, not_a_field
from mdot_jax.serving import named_models, schema
from mdot_jax.serving.plan_request import CHOICES as PLAN_CHOICES
from mdot_jax.serving.plan_request import Plan
from mdot_jax.serving.prediction import DERIVED, Prediction
from mdot_jax.serving.request import CHOICES, TrainingJob, in_fields, one_spec

MAX_JSON_KB = 256
MAX_LIST = 64  # values of a list field a request may give (each is priced)
MAX_PLAN = 1_000  # candidates or layouts a plan may price (each a step; about 10-90 ms)
ANSWERS = 4096  # answers kept (an LRU of request bodies)
ANSWER_MB = 256  # and the most JSON they hold together
JOB_FIELDS = [f.name for f in dataclasses.fields(TrainingJob) if f.name != "model"]
PLAN_FIELDS = tuple(f.name for f in dataclasses.fields(Plan))[1:]  # but the job


def _schema(plan: bool = False) -> dict:
    """The OpenAPI request body of a prediction's JSON object (`plan`: a plan's), each field
    as `schema.field_schemas` reads it from the request types, the service's own rules said
    where they differ (module docs)."""
    props: dict[str, dict] = {"model": {
        "type": "string", "description": "the SHA-256 POST /v1/models gave, or a name GET "
                                         "/v1/models lists"}}
    props.update(schema.field_schemas(TrainingJob, CHOICES))
    props["device_spec"] = dict(props["device_spec"], anyOf=[{"type": "object"}, {
        "type": "null"}], description="the spec of a GPU the catalog lacks, as a JSON object "
                                      "of the catalog's fields (GET /v1/devices lists them)")
    props["checkpoint"] = dict(props["checkpoint"], description="a shipped checkpoint's "
                               "name; null: chosen from the device")
    if plan:  # its gpus are the plan's
        props.update(schema.field_schemas(Plan, PLAN_CHOICES))
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": {
        "type": "object", "required": ["model"], "properties": props}}}}}


def _option(predicted: dict) -> dict:
    """The JSON schema of a plan's candidate (`plan.Option.to_json`): its fields, the keys of
    its prediction it carries (`plan.ANSWERED`, as `predicted` describes them) and its
    layout's."""
    from mdot_jax.serving import plan

    option = schema.answer_schema(plan.Option, {k: k for k in ("feasible", "hours_band")})
    props = option["properties"]
    said = props.pop("prediction")["description"]
    props.update({k: predicted["properties"][k] for k in plan.ANSWERED}, layout={
        "anyOf": [schema.answer_schema(plan.Layout, {}), {"type": "null"}],
        "description": props["layout"]["description"]})
    return dict(option, description=f"a candidate; its prediction: {said}")


def _answers(said: str, body: dict) -> dict:
    """The OpenAPI responses of a route whose 200 answers JSON `body`, said so."""
    return {"200": {"description": said, "content": {"application/json": {"schema": body}}}}


class _Answer(Exception):
    """A 4xx answer: its status and one line."""

    def __init__(self, status: int, message: str, field: str = ""):
        super().__init__(message)
        self.status, self.field = status, field


class ModelStore:
    """Uploaded models (`KINDS`) by content hash, at most `limit` (least recently used out)."""

    def __init__(self, folder: Path, limit: int = 64):
        self.folder, self.limit = Path(folder), limit
        self.specs = self.folder.with_name("specs")  # GPUs requests describe
        for f in (self.folder, self.specs):
            f.mkdir(parents=True, exist_ok=True)

    def put(self, data: bytes) -> str:
        return _keep(self.folder, data, _kind(data), self.limit, KINDS)

    def put_spec(self, spec: Any) -> str:
        """A request's `device_spec`, a JSON object, as the file `TrainingJob` reads: a name is
        refused (the service reads no file of its own that a request names)."""
        spec = one_spec(spec)
        if not isinstance(spec, dict):
            raise _Answer(422, "device_spec: the GPU's spec sheet as a JSON object of the "
                          "catalog's fields (GET /v1/devices shows them), not a file's name",
                          "device_spec")
        sha = _keep(self.specs, json.dumps(spec, sort_keys=True).encode(), ".json",
                    self.limit, (".json",))
        return str(self.specs / f"{sha}.json")

    def said(self, message: str) -> str:
        """`message` with this store's files named as the models they hold (`model SHA`): a
        client never sees the server's folders."""
        for kind in KINDS:
            message = re.sub(re.escape(f"{self.folder}{os.sep}") + "([0-9a-f]{64})"
                             + re.escape(kind), r"model \1", message)
        message = named_models.said(message)
        return re.sub("--device-spec " + re.escape(f"{self.specs}{os.sep}") + "[0-9a-f]{64}"
                      + re.escape(".json"), "device_spec", message)

    def get(self, sha: Any) -> Path:
        if isinstance(sha, str) and (found := named_models.find(sha)) is not None:
            return found.config  # a named model's config.json: the package's, not a user's
        if not isinstance(sha, str) or len(sha) != 64 or not all(
                c in "0123456789abcdef" for c in sha):
            raise _Answer(422, f"model {sha!r}: expected the SHA-256 that POST /v1/models "
                          "answered, or a name GET /v1/models lists", "model")
        path = next((p for p in (self.folder / f"{sha}{k}" for k in KINDS) if p.exists()), None)
        if path is None:
            raise _Answer(404, f"model {sha}: not uploaded here (POST /v1/models)", "model")
        os.utime(path)
        return path


KINDS = (".onnx", ".json")  # what an uploaded model is kept as


def _keep(folder: Path, data: bytes, suffix: str, limit: int, kinds: tuple[str, ...]) -> str:
    """`data` in `folder` as SHA-256 + `suffix` (written to a temporary name and renamed: a
    reader sees all of it or nothing), at most `limit` files (the least recently used go)."""
    sha = hashlib.sha256(data).hexdigest()
    path = folder / f"{sha}{suffix}"
    if not path.exists():
        tmp = path.with_name(f".{sha}.tmp-{uuid.uuid4().hex[:8]}")
        tmp.write_bytes(data)
        os.replace(tmp, path)
    os.utime(path)
    writers.evict(folder, kinds, limit)  # one limit for the folder's kinds
    return sha


def _kind(data: bytes) -> str:
    """How an upload is kept: an ONNX file, or a language model's config.json (a JSON object with
    a `model_type`, priced at the request's `seq_len`); anything else is a 422."""
    import onnx

    try:
        config = json.loads(data)
    except ValueError:  # not JSON (nor UTF-8): ONNX's protobuf, or nothing
        config = None
    if isinstance(config, dict) and "model_type" in config:
        return ".json"
    try:
        onnx.load_model_from_string(data)
        return ".onnx"
    except Exception:  # protobuf raises its own DecodeError, and more
        pass
    raise _Answer(422, "model: neither an ONNX file nor a Hugging Face config.json (upload "
                  "the bytes of a .onnx, or of a config.json with its model_type)", "model")


class _Twice(ValueError):
    """A JSON object's key given twice (its name)."""


def _once(pairs: list) -> dict:
    """A JSON object whose keys are each given once (`json.loads`'s `object_pairs_hook`)."""
    seen: dict = {}
    for k, v in pairs:
        if k in seen:
            raise _Twice(k)
        seen[k] = v
    return seen


def _known(body: dict, extra: tuple = ()) -> None:
    """Every field of `body` one the request takes, its model given."""
    fields = list(dict.fromkeys(["model", *JOB_FIELDS, *extra]))  # a plan's gpus once
    if unknown := sorted(set(body) - set(fields)):
        e = not_a_field(unknown[0], fields)
        raise _Answer(422, str(e), e.field)
    if "model" not in body:
        raise _Answer(422, "model: missing (the SHA-256 that POST /v1/models answered, or a "
                      "name GET /v1/models lists)", "model")


def _job(store: ModelStore, body: dict, extra: tuple = (),
         build: Callable[..., TrainingJob] = TrainingJob) -> tuple[TrainingJob, dict]:
    """The request's `TrainingJob` (its model from the store; `build` it from the fields) and
    its other fields (each one the request takes: `_known`)."""
    from mdot_jax.storage.shipped import shipped_names

    for name, value in body.items():  # each value of a list is priced: a bounded request
        if isinstance(value, list) and len(value) > MAX_LIST:
            raise _Answer(422, f"{name}: {len(value):,} values; at most {MAX_LIST} a request",
                          name)
    for name in ("batch_size", "gpus"):  # JSON has lists where Python has tuples
        if isinstance(body.get(name), list):
            body[name] = tuple(body[name])
    model = store.get(body.get("model"))
    if body.get("device_spec") is not None:
        body["device_spec"] = store.put_spec(body["device_spec"])
    if body.get("checkpoint") is not None and body["checkpoint"] not in shipped_names():
        raise _Answer(422, f"checkpoint {body['checkpoint']!r}: the name of a shipped one "
                      f"({', '.join(shipped_names())}), not a folder's", "checkpoint")
    fields = {k: v for k, v in body.items() if k in JOB_FIELDS}
    return build(model=str(model), **fields), {k: body[k] for k in extra if k in body}


def create_app(cache_dir: str | Path, max_upload_mb: float = 64.0, max_models: int = 64):
    """The FastAPI application (module docstring)."""
    from fastapi import FastAPI, Request
    from fastapi.responses import JSONResponse, Response

    from converters import ConversionError
    from mdot_jax import __version__
    from mdot_jax.gpu import catalog
    from mdot_jax.serving import fits
    from mdot_jax.serving import plan as planning
    from mdot_jax.serving.front import predict
    from mdot_jax.serving.model_source import keep_sequences

    store = ModelStore(Path(cache_dir) / "models", max_models)
    keep_sequences(Path(cache_dir) / "sequences")
    app = FastAPI(title="mdot", version=__version__,
                  description="Training-time predictions for schedulers (`mdot serve`).")

    @app.exception_handler(_Answer)
    async def answer(_: Request, e: _Answer):
        return JSONResponse({"error": str(e), "field": e.field}, status_code=e.status)

    @app.exception_handler(Exception)
    async def failed(_: Request, e: Exception):  # a bug: one line, the service stays up
        line = (str(e).strip().splitlines() or [""])[0]
        return JSONResponse({"error": f"internal error: {type(e).__name__}: {line}",
                             "field": ""}, status_code=500)

    async def read(request: Request, limit: float) -> bytes:
        size = request.headers.get("content-length")
        if size is not None and size.isdigit() and int(size) > limit:
            raise _Answer(413, f"body: {int(size):,} bytes, over the limit of {int(limit):,}")
        data = b""
        async for chunk in request.stream():
            data += chunk
            if len(data) > limit:
                raise _Answer(413, f"body: over the limit of {int(limit):,} bytes")
        return data

    async def body_of(request: Request) -> dict:
        data = await read(request, MAX_JSON_KB * 1024)
        try:
            body = json.loads(data, object_pairs_hook=_once)
        except _Twice as e:
            raise _Answer(400, f"body: field '{e}' given twice (JSON would keep the last)",
                          str(e)) from None
        except (ValueError, UnicodeDecodeError) as e:
            raise _Answer(400, f"body: not JSON ({e})") from None
        if not isinstance(body, dict):
            raise _Answer(400, "body: a JSON object of the request's fields")
        return body

    def priced(work):
        try:
            return work()
        except RequestError as e:
            raise _Answer(422, store.said(str(e)), e.field) from None
        except ConversionError as e:
            raise _Answer(422, *in_fields(store.said(str(e)))) from None
        except MdotError as e:
            raise _Answer(422, store.said(str(e))) from None

    @app.get("/healthz")
    def healthz() -> dict:
        return {"status": "ok", "version": __version__}

    @app.get("/v1/devices")
    def devices() -> list:
        return [g.to_json() for g in catalog.catalog().values()]

    @app.get("/v1/models")
    def models() -> list:
        return [m.to_json() for m in named_models.named().values()]

    @app.post("/v1/models", openapi_extra={"requestBody": {"content": {
        "application/octet-stream": {"schema": {"type": "string", "format": "binary"}}}}})
    async def upload(request: Request) -> dict:
        data = await read(request, max_upload_mb * 2 ** 20)
        return {"model": store.put(data), "bytes": len(data)}

    kept = Answers(ANSWERS, ANSWER_MB * 2 ** 20)

    def answer_for(kind: str, text: str) -> bytes:
        """The answer to a request body (canonical JSON) as JSON, priced once: predictions
        depend on nothing else (the model is named by its content)."""
        if (known := kept.get((kind, text))) is None:
            known = json.dumps(priced_answer(kind, text), ensure_ascii=False, allow_nan=False,
                               separators=(",", ":")).encode()
            kept.put((kind, text), known)
        return known

    def priced_answer(kind: str, text: str) -> Any:
        body = json.loads(text)
        if kind == "predict":
            job, _ = _job(store, body)
            got = predict(job)
            if isinstance(got, list):
                return [p.to_json() for p in got]
            return fits.suggest(job, got).to_json()  # where it does not fit: what would
        job, extra = _job(store, body, PLAN_FIELDS, planning.job_for_plan)
        fields: dict[str, Any] = {k: tuple(v) if isinstance(v, list) else v
                                  for k, v in extra.items()}
        asked = Plan(job, **fields)
        return [o.to_json() for o in planning.plan(asked, limit=MAX_PLAN)]

    async def answered(kind: str, request: Request) -> Any:
        body = await body_of(request)
        _known(body, PLAN_FIELDS if kind == "plan" else ())
        store.get(body["model"])  # a model evicted since is not answered from the cache
        text = json.dumps(body, sort_keys=True)
        return Response(await _threaded(priced, lambda: answer_for(kind, text)),
                        media_type="application/json")

    one = schema.answer_schema(Prediction, DERIVED)  # one, or a list for several

    @app.post("/v1/predict", openapi_extra=dict(_schema(), responses=_answers(
        "the prediction (a list where batch_size or gpus gives several)",
        {"anyOf": [one, {"type": "array", "items": one}]})))
    async def predict_(request: Request) -> Any:
        return await answered("predict", request)

    @app.post("/v1/plan", openapi_extra=dict(_schema(plan=True), responses=_answers(
        "the candidates, ranked: feasible first by cost (by time where no price is known; a "
        "job twice as soon worth 1% more cost, twice the GPUs needing 1% less time)",
        {"type": "array", "items": _option(one)})))
    async def plan_(request: Request) -> Any:
        return await answered("plan", request)

    return app


class Answers:
    """Answers by key, least recently used first out: at most `count` of them and `nbytes`
    together (one larger is not kept); safe across the service's worker threads."""

    def __init__(self, count: int, nbytes: int):
        self.count, self.nbytes, self.held = count, nbytes, 0
        self._kept: OrderedDict[Any, bytes] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key) -> bytes | None:
        with self._lock:
            if (value := self._kept.get(key)) is not None:
                self._kept.move_to_end(key)
            return value

    def put(self, key, value: bytes) -> None:
        with self._lock:
            if (old := self._kept.pop(key, None)) is not None:
                self.held -= len(old)
            if len(value) > self.nbytes:
                return
            self._kept[key], self.held = value, self.held + len(value)
            while len(self._kept) > self.count or self.held > self.nbytes:
                self.held -= len(self._kept.popitem(last=False)[1])


async def _threaded(fn, *args):
    """`fn(*args)` on a worker thread: pricing is CPU work, the event loop keeps answering."""
    from starlette.concurrency import run_in_threadpool

    return await run_in_threadpool(fn, *args)


def run(host: str = "127.0.0.1", port: int = 8000, cache_dir: str | None = None,
        max_upload_mb: float = 64.0) -> None:
    """Serves `create_app` with uvicorn until interrupted."""
    try:
        import uvicorn
    except ImportError:
        raise MdotError("mdot serve needs FastAPI and uvicorn: pip install 'mdot-jax[serve]'"
                        ) from None
    import errno
    import socket

    with socket.socket() as probe:  # a port in use is one line, not a server's log
        try:
            probe.bind((host, port))
        except OSError as e:  # a name no interface has (gaierror, EADDRNOTAVAIL): the host's
            flag = f"--host {host}" if isinstance(e, socket.gaierror) or e.errno == \
                errno.EADDRNOTAVAIL else f"--port {port}"
            raise MdotError(f"{flag}: cannot listen on {host}:{port} ({e.strerror})") from None
    folder = Path(cache_dir) if cache_dir else Path.home() / ".cache" / "mdot" / "serve"
    uvicorn.run(create_app(folder, max_upload_mb), host=host, port=port, log_level="warning")
