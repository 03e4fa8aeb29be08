"""A Hugging Face config.json's fields as `converters.hf_config` reads them: per-layer lists
cut to a new depth (`per_layer`), the shape checked before a model is built (`check_shape`),
the shape fields transformers' defaults filled in (`defaulted`), a model type known by
another name (`known_as`), the names it is built by checked (`check_names`), the field whose
value transformers found no entry for (`holding`), the odd values where transformers failed in
its own code (`suspects`)."""

from __future__ import annotations

import contextlib
import json
from typing import Any

from converters.errors import ConversionError

# the fields that set a causal LM's size: left out of a config.json, transformers' defaults
# (a 7B Llama's, a 124M GPT-2's) build the model, which the user should hear
MAX_LAYERS = 2048  # a stack deeper than this is refused (`check_shape`)
DEPTH_FIELDS = ("num_hidden_layers", "encoder_layers", "decoder_layers", "num_decoder_layers")
SHAPE_FIELDS = ("hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size")
WIDTH_FIELDS = ("hidden_size", "vocab_size", "intermediate_size")  # none (0 or less): refused


def check_names(fields: dict, where: str) -> None:
    """One error where `model_type` is no name or `architectures` no list of class names
    (other code reads them before transformers does)."""
    kind, archs = fields.get("model_type"), fields.get("architectures")
    if not isinstance(kind, str) or not kind:
        raise ConversionError(f"{where}: model_type {kind!r}: expected a name (\"llama\")")
    if archs is not None and not (isinstance(archs, list) and all(
            isinstance(a, str) for a in archs)):
        raise ConversionError(f"{where}: architectures {archs!r:.60}: expected a list of class "
                              "names ([\"LlamaForCausalLM\"])")


def per_layer(fields: dict, overrides: dict) -> dict:
    """`overrides`, and where they set a stack's depth (`DEPTH_FIELDS`, GPT-2's `n_layer`),
    each field of `fields` listing one value a layer at the old depth (Qwen3's, Gemma 3's
    `layer_types`, SmolLM3's `no_rope_layers`) cut to the new depth or its pattern repeated:
    transformers refuses a depth its lists do not match."""
    new = dict(overrides)
    for f in (*DEPTH_FIELDS, "n_layer", "num_layers", "n_layers"):
        was, now = fields.get(f), overrides.get(f)
        if not (isinstance(was, int) and isinstance(now, int) and was > 0 and now > 0):
            continue
        for k, v in fields.items():
            if k not in overrides and isinstance(v, list) and len(v) == was:
                new[k] = [v[i % was] for i in range(now)]
    return new


def known_as(transformers: Any, kind: str, fields: dict) -> str:
    """Where `kind` is no model type of transformers' (a model's own code, `auto_map`: Kimi
    K2's `kimi_k2`) but the class its `architectures` names is: what to set it to."""
    from transformers import CONFIG_MAPPING

    archs = fields.get("architectures")
    arch = archs[0] if isinstance(archs, list) and archs else None
    known = getattr(getattr(transformers, str(arch), None), "config_class", None)
    if kind in CONFIG_MAPPING or known is None:
        return ""
    return (f"; its architectures name {arch}, transformers' own for model_type "
            f"{known.model_type!r}: set that to build it")


def holding(fields: dict, value: Any) -> str | None:
    """The field of `fields` (or of a dict in it, as `rope_scaling.rope_type`) set to the
    string `value`: where transformers looked a name up and found none (`hidden_act`)."""
    if not isinstance(value, str):
        return None
    for k, v in fields.items():
        if v == value:
            return k
        if isinstance(v, dict) and (inner := holding(v, value)):
            return f"{k}.{inner}"
    return None


def suspects(transformers: Any, kind: str, fields: dict) -> str:
    """Where transformers failed in its own code (a division by zero, a string where a count
    goes): the given fields whose value differs in kind from the model type's default
    (`_odd`), as a hint."""
    try:
        default = transformers.AutoConfig.for_model(kind).to_dict()
    except Exception:  # (a model type transformers does not know: said already)
        return ""
    odd = [f"{k} {json.dumps(v)[:20]}" + ("" if default.get(k) is None else
                                          f" (its default {json.dumps(default[k])[:20]})")
           for k, v in fields.items() if k not in ("architectures", "model_type")
           and v is not None and _odd(v, default.get(k))]
    return f"; a value to check: {', '.join(odd[:3])}" if odd else ""


def _odd(v: Any, default: Any) -> bool:
    """Whether a given value differs in kind from its default: another JSON type, or none, 0
    or less, where the default is a positive number; without a default (None), none, 0 or
    less, or a number written as text."""
    if default is None:
        return _numeric(v) and v <= 0 or isinstance(v, str) and _number(v)
    if isinstance(default, bool) != isinstance(v, bool) or isinstance(default, str) != \
            isinstance(v, str):
        return True
    return _numeric(default) and (not _numeric(v) or default > 0 and v <= 0
                                  or isinstance(default, int) and isinstance(v, float))


def _numeric(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def check_shape(cfg: Any, given: dict, where: str) -> None:
    """One error naming the field (as `given`, the config.json's fields, names it) where a
    stack, the width or the vocabulary is given as none (0 or less), the stack is deeper than
    `MAX_LAYERS`, or the attention heads cannot be built: no query head,
    or key/value heads that do not share the query heads out evenly (grouped-query attention
    gives each a whole number of them)."""
    names = getattr(cfg, "attribute_map", {})

    def said(f: str) -> str:
        return names.get(f, f) if names.get(f, f) in given else f

    for f in (*DEPTH_FIELDS, *WIDTH_FIELDS):  # as given: a typo, not a default
        n = getattr(cfg, f, None)
        if isinstance(n, int) and not isinstance(n, bool) and n < 1 and said(f) in given:
            raise ConversionError(f"{where}: {said(f)} is {n}; a model has at least one")
    for f in DEPTH_FIELDS:
        if isinstance(n := getattr(cfg, f, None), int) and n > MAX_LAYERS:
            raise ConversionError(f"{where}: {said(f)} is {n:,}, over {MAX_LAYERS:,} layers (a "
                                  "typo?): a graph that deep takes hours and tens of GB to "
                                  "build")
    heads, kv = (getattr(cfg, f, None) for f in ("num_attention_heads", "num_key_value_heads"))
    if not isinstance(heads, int) or isinstance(heads, bool):
        return
    if heads < 1:
        raise ConversionError(f"{where}: {said('num_attention_heads')} is {heads}; a model "
                              "attends with one head or more")
    kv_given = names.get("num_key_value_heads", "num_key_value_heads") in given  # not the
    # class's default (DeepSeek's latent attention keeps 128 whatever its heads)
    if kv_given and isinstance(kv, int) and not isinstance(kv, bool) and (kv < 1 or heads % kv):
        raise ConversionError(
            f"{where}: {said('num_attention_heads')} ({heads}) is not a multiple of "
            f"{said('num_key_value_heads')} ({kv}): grouped-query attention shares each "
            "key/value head among a whole number of query heads")


def defaulted(cfg: Any, given: dict) -> dict[str, Any]:
    """{field: the default taken} of `SHAPE_FIELDS` that `given` (the config.json's fields)
    does not set under the name the model's config uses (GPT-2's `n_embd`, MPT's `d_model`);
    none of a heterogeneous config's per-layer fields (its layers' own, no whole config's)."""
    names, taken = getattr(cfg, "attribute_map", {}), {}
    for f in SHAPE_FIELDS:
        if f not in given and names.get(f, f) not in given:
            with contextlib.suppress(Exception):  # (transformers' per-layer refusal: its own
                taken[f] = getattr(cfg, f)  # type, no AttributeError)
    return taken
