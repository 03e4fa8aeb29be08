"""Well-known models by name: each one's Hugging Face `config.json` ships with the package
(`configs/<name>/config.json`: the architecture's fields as its Hub repository has them; an
image model's `image_size` its image processor's crop where the config has none), so a job
can name `llama-3.1-8b` where it would give a config.json's path.

The rules:
- a path that exists is a path, always: a folder or file of the user's shadows a name;
- a name matches case-insensitively, as listed, or as its Hub repository (`meta-llama/
  Llama-3.1-8B`); of a repository's name only the part after its owner counts, and the
  fine-tuned variants' words that change no weight's shape (`-Instruct`, `-chat`, `-hf`,
  `-it`, wherever they stand) and Meta's old `Meta-` prefix are dropped, so
  `Meta-Llama-3.1-8B-Instruct` is `llama-3.1-8b`, `Mixtral-8x7B-Instruct-v0.1` `mixtral-8x7b`;
- a string that is neither a file nor a name, and is not a file's name (no `.onnx`, `.npz` or
  `.json`), is one error naming the closest names.
`configs/index.json` holds each name's repository and its parameter count as transformers
counts them (the tests export every one and compare)."""

from __future__ import annotations

import dataclasses
import difflib
import functools
import json
import os
import re
from pathlib import Path
from typing import Any

from mdot_jax.errors import RequestError

HOME = Path(__file__).parent / "configs"
FILE_SUFFIXES = (".onnx", ".npz", ".json")  # a string ending so names a file, not a model
_VARIANTS = re.compile(r"-(instruct|chat|hf|it)(?=-|$)")  # a fine-tune's tokens of its name


@dataclasses.dataclass(frozen=True)
class NamedModel:
    name: str
    repo: str  # its Hugging Face Hub repository, where its config.json is from
    parameters: int  # as transformers counts them (tied weights once)

    @property
    def config(self) -> Path:
        return HOME / self.name / "config.json"

    @property
    def source(self) -> str:
        return f"https://huggingface.co/{self.repo}/blob/main/config.json"

    def to_json(self) -> dict:
        """What a listing shows of it (not its file: the service's clients never see it)."""
        return dict(name=self.name, repo=self.repo, parameters=self.parameters, kind=self.kind,
                    positions=self.positions, source=self.source)

    @functools.cached_property
    def fields(self) -> dict:
        """Its config.json's."""
        return json.loads(self.config.read_text())

    @property
    def positions(self) -> int | None:
        """The longest sequence its position table or rotary scaling was made for (None: a
        model of images)."""
        return self.fields.get("max_position_embeddings") or self.fields.get("n_positions")

    @property
    def kind(self) -> str:
        """What it is, in words, read from its config.json."""
        head = (self.fields.get("architectures") or [""])[0]
        experts = next((self.fields[k] for k in ("num_local_experts", "num_experts",
                                                 "n_routed_experts") if self.fields.get(k)), 0)
        if head.endswith("ForImageClassification"):
            return "image classifier"
        if head.endswith("ForMaskedLM"):
            return "encoder (masked LM)"
        if head.endswith("ForConditionalGeneration"):
            return "encoder-decoder"
        return f"decoder, {experts} experts" if experts else "decoder"


def _key(name: str) -> str:
    """How a name or repository is matched (module docstring)."""
    key = _VARIANTS.sub("", name.strip().lower().rsplit("/", 1)[-1])
    return key.removeprefix("meta-") if key.startswith("meta-llama-") else key


@functools.lru_cache(maxsize=1)
def named() -> dict[str, NamedModel]:
    """Every named model, by name."""
    index = json.loads((HOME / "index.json").read_text())
    return {name: NamedModel(name, **fields) for name, fields in index.items()}


@functools.lru_cache(maxsize=1)
def _by_key() -> dict[str, NamedModel]:
    return {_key(k): m for m in named().values() for k in (m.name, m.repo)}


def find(name: str) -> NamedModel | None:
    """The named model `name` means (module docstring), or None."""
    return _by_key().get(_key(name))


def resolve(model: Any) -> Any:
    """`model`, or the config.json of the named model it names (module docstring's rules)."""
    if not isinstance(model, str) or _exists(model):
        return model
    if (found := find(model)) is not None:
        return str(found.config)
    if model.lower().endswith(FILE_SUFFIXES):
        return model  # a file's name: its reader says it is not there
    close = difflib.get_close_matches(_key(model), list(_by_key()), n=3, cutoff=0.6)
    names = list(dict.fromkeys(_by_key()[k].name for k in close))  # a repo's and its name's
    shown = model if len(model) <= 80 else model[:60] + "..."
    hub = re.fullmatch(r"[\w.-]+/[\w.-]+", model) and not _exists(model.split("/")[0])
    raise RequestError(f"model {shown!r}: no such file, nor a named model" + (
        f" (did you mean {' or '.join(names)}?)" if names else "")
        + "; `mdot models` lists the names" + (  # a Hub repository's id: its config is a file
            f"; any Hugging Face model: give its config.json (https://huggingface.co/{model}"
            "/blob/main/config.json, nothing is downloaded)" if hub else ""), "model")


def _exists(path: str) -> bool:
    try:
        return Path(path).exists()
    except (OSError, ValueError):  # a string no file system takes for a path (too long)
        return False


def said(message: str) -> str:
    """`message` with each named model's config.json path said as its name (the package's
    folders are not the user's)."""
    path = re.escape(f"{HOME}{os.sep}") + r"([^/\\\s]+)" + re.escape(f"{os.sep}config.json")
    return re.sub(path, r"\1", message)
