"""A vision-language model from its config.json (PaliGemma, InternVL, Aya Vision, Command A
Vision, DeepSeek-VL: those transformers builds no causal LM of; Gemma 3, Gemma 4, Qwen3.5,
causal LMs too, where an image size is asked): built by transformers'
`AutoModelForImageTextToText` on the meta device and exported as its fine-tuning step on one
image a sample, at the size its vision config gives, and `seq_len` tokens of text around it,
the image's features the first N (the placeholders a processor writes); every token's loss.

Such a model encodes the images, then writes their features into the token embeddings at the
placeholder tokens: `masked_scatter` at a mask the token ids give, after checking the count of
placeholders against the features' rows: values the meta device does not have. Exported in
its place (`placed`), each sample's features take its first N positions: the same tensors read
and one copy into the embeddings, the text after them, no check. N is counted by running the
forward on the meta device up to there (`image_tokens`).

An encoder of a grid of patches (Qwen2-VL, Qwen2.5-VL, Qwen3-VL, GLM-4V: `image_grid_thw`)
takes any image size (`side`, default `DEFAULT_SIDE`); it indexes the patches by the grid's
sizes (windows, rotary positions, one attention per image), values computed on the CPU while
the model's tensors stay on the meta device (`meta_joins`), so that the graph holds the
example's images: it is exported at the batch it is priced at (`Images.fixed`); a video of F
frames is its grid over time, F / `temporal_patch_size` patches deep, given as so many images
(its tokens so many times an image's: what its video path encodes, by the same encoder, each
patch of frames attended to alone). Its model's
positions (M-RoPE, from where the placeholders are) count the tokens in order, and Qwen3-VL's
features added to the first layers' hidden states (`_deepstack_process`) are added to the
first N positions. An encoder of listed patches (Gemma 4's: each patch's place, pooled k x k)
takes the side asked, a whole number of pooled cells, its places held the same way; LLaVA's
list of features an image too. Pixtral's encoder (Mistral 3's) takes an image of any size up
to its config's, cut to it by the `image_sizes` its code reads (held as a grid's sizes are);
LLaVA-NeXT's and LLaVA-OneVision's the grid of tiles transformers cuts an image of the size
asked into, beside the whole resized (`any_resolution`, its `image_sizes` held so too).
Idefics3's and SmolVLM's processors resize an image to a side and cut it into tiles beside
the whole (`split_image`); their encoder drops a batch's padding tiles by their values, every
tile is an image's here (`every_tile`). LFM2-VL's lists of patches are what its image
processor makes of an image of the size asked (`processed`), held as a grid's sizes are.

Llama 3.2 Vision's text reads its image by cross-attention layers (`CROSS` in its forward):
its processor pads every image to `max_num_tiles` tiles of the vision config's side, all of
which its encoder runs; the step takes those tiles, their aspect ratio's id and mask and a
cross-attention mask of every token over every tile, the image's token first (`_cross_step`).
"""

from __future__ import annotations

import contextlib
import inspect
import sys
import types
from collections.abc import Callable, Iterator
from typing import Any

from converters.errors import ConversionError
from converters.image_tiles import (
    GRID,
    LISTS,
    Images,
    any_resolution,
    cross_tiles,
    every_tile,
    features_code,
    processed,
    split_image,
    splits,
    unpadded,
)
from converters.meta_joins import meta_joins
from converters.patches import replaced

AUTO = "AutoModelForImageTextToText"  # transformers' auto class of these models
# its inputs that tile an image (an image's sizes, its tiles' masks): refused
TILES = ("image_sizes", "pixel_attention_mask", "spatial_shapes")
LISTED = "image_position_ids"  # an encoder of listed patches' inputs: each patch's [x, y]
CROSS = "aspect_ratio_ids"  # the forward's input of tiles its text reads by cross-attention
DEFAULT_SIDE = 448  # a grid encoder's image side where none is asked (256 tokens at 28 px)
MOST = dict(image_size=16384, video_frames=4096)  # the largest image side and video priced


class _Counted(Exception):
    """Ends `image_tokens`' forward once the image's features are counted."""


def image_text_model(transformers: Any, cfg: Any) -> Any:
    """transformers' auto class for `cfg` where it is a vision-language model's (an image and
    text in, text out), else None."""
    from transformers.models.auto import modeling_auto as auto

    mapping = getattr(auto, "MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING", {})
    return getattr(transformers, AUTO) if type(cfg) in mapping else None


def _encoder(owner: Any) -> tuple[Any, Any, list[str]]:
    """`owner`'s (a model's or its class's) image encoder, `get_image_features` (None: it has
    none), its parameters and those of them that tile an image."""
    encode = getattr(owner, "get_image_features", None)
    takes = inspect.signature(encode).parameters if encode else {}
    return encode, takes, [p for p in TILES if p in takes and (  # LLaVA's optional
        p != "image_sizes" or takes[p].default is inspect.Parameter.empty)]  # image_sizes: none


def image_sizes(cfg: Any) -> str | None:
    """The image sizes `example_images` takes for `cfg`, in words: its vision config's side, a
    grid encoder's default, a listed-patch encoder's multiple (Gemma 4's); None where its config
    says nothing of them or its class encodes none of them (Llama 3.2 Vision's tiles)."""
    from transformers.models.auto import modeling_auto as auto

    model = getattr(auto, "MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING", {}).get(type(cfg), None)
    encode, _, tiles = _encoder(model)
    vision: Any = getattr(cfg, "vision_config", None)
    if _crosses(model):
        return str(vision.image_size)
    if _sized(vision):
        return f"a multiple of {vision.patch_size * getattr(cfg, 'spatial_merge_size', 1)}"
    if encode is None or tiles:
        return None
    if hasattr(vision, "temporal_patch_size"):  # a grid's (Qwen-VL's)
        return str(DEFAULT_SIDE)
    if isinstance(k := getattr(vision, "pooling_kernel_size", None), int):  # listed patches
        return f"a multiple of {vision.patch_size * k}"
    size = getattr(vision, "image_size", None)
    size = size[0] if isinstance(size, (list, tuple)) and size else size
    return str(size) if isinstance(size, int) and size > 0 else None


def example_images(model: Any, where: str, kind: str, images: int = 1,
                   side: int | None = None, frames: int | None = None) -> Images:
    """`images` samples' images at the size `model`'s vision config gives (a grid encoder's:
    `side`, default `DEFAULT_SIDE`; a video of `frames` frames where given), held in the graph
    where its encoder indexes them by a grid or keeps a list an image; a ConversionError where
    it tiles images by their data, its config gives no size, or `side` (`frames`) is not one
    it takes."""
    import torch

    for name, value in (("image_size", side), ("video_frames", frames)):
        if value and value > MOST[name]:  # an example of it would not fit in memory
            raise ConversionError(f"{where}: {name} {value:,}: more than {MOST[name]:,}, the "
                                  "most priced")
    inner = getattr(model, "model", model)
    encode, takes, tiles = _encoder(inner)
    if frames and GRID not in takes:
        raise ConversionError(f"{where}: video_frames {frames}: model_type {kind!r} encodes "
                              "images, not videos over time (Qwen-VL's grid encoders do)")
    if _crosses(type(model)):
        return cross_tiles(model, where, kind, side)
    if (vision := getattr(model.config, "vision_config", None)) is None:  # (Mistral 4's, UDOP's)
        raise ConversionError(f"{where}: model_type {kind!r} gives no vision_config: its "
                              "images are not priced from its config; export the model itself "
                              "with converters.from_torch")
    if "image_sizes" in takes and hasattr(model.config, "image_grid_pinpoints"):  # any-res
        return any_resolution(model, images, side)
    if LISTS in takes:  # LFM2-VL's lists of patches
        return processed(model, images, side)
    if splits(inner):  # Idefics3's, SmolVLM's tiles and the whole
        return split_image(model, images, where, kind, side)
    if _sized(vision):  # Pixtral's patches of the image's own size, cut by its image_sizes
        p, side = vision.patch_size * getattr(model.config, "spatial_merge_size", 1), \
            side or vision.image_size  # its largest by default
        if side % p or side > vision.image_size:
            raise ConversionError(f"{where}: image_size {side}: model_type {kind!r} takes "
                                  f"images of any size up to {vision.image_size}, cut into "
                                  f"cells of {p} pixels: give a multiple of {p}")
        return Images(torch.zeros(images, vision.num_channels, side, side),
                      {"image_sizes": torch.tensor([[side, side]] * images)}, [side, side], True)
    if encode is None or tiles:
        raise ConversionError(
            f"{where}: model_type {kind!r} " + (
                f"tiles an image by its {tiles[0]} (its count of tiles the image's data)"
                if tiles else "reads its images other than through image features in its "
                "text") +
            ": not priced from its config; export the model itself with converters.from_torch")
    if GRID in takes:  # patches of p x p pixels, merged m x m into a token
        p, m = vision.patch_size, getattr(vision, "spatial_merge_size", 1)
        t = getattr(vision, "temporal_patch_size", 1)
        c = next((v for f in ("in_channels", "in_chans", "num_channels")
                  if isinstance(v := getattr(vision, f, None), int)), 3)
        side = side or DEFAULT_SIDE
        if side % (p * m):
            raise ConversionError(f"{where}: image_size {side}: model_type {kind!r} cuts "
                                  f"images into cells of {p * m} pixels: give a multiple")
        if (frames or t) % t:
            raise ConversionError(f"{where}: video_frames {frames}: model_type {kind!r} "
                                  f"encodes a video {t} frames a patch: give a multiple of {t}")
        g, n = side // p, (frames or t) // t  # an image: its frame t times, one patch deep
        # a video's n patches over time as n images (GLM-4V's video path; Qwen-VL's encoder
        # attends within each of them alike)
        return Images(torch.zeros(images, n * g * g, c * t * p * p),
                      {GRID: torch.tensor([[1, g, g]] * (images * n))}, [side, side], True,
                      frames=frames or 0)
    if LISTED in takes:  # patches of p x p pixels listed at their places, pooled k x k
        p, k = vision.patch_size, getattr(vision, "pooling_kernel_size", 1)
        if not side or side % (p * k):
            raise ConversionError(f"{where}: image_size {side}: model_type {kind!r} pools "
                                  f"its {p}-pixel patches {k} x {k}: give a multiple of "
                                  f"{p * k}")
        g = side // p
        ys, xs = torch.meshgrid(torch.arange(g), torch.arange(g), indexing="ij")
        places = torch.stack([xs, ys], -1).reshape(1, g * g, 2).expand(images, -1, -1)
        return Images(torch.zeros(images, g * g, 3 * p * p), {LISTED: places},
                      [side, side], True)
    size, channels = getattr(vision, "image_size", None), getattr(vision, "num_channels", 3)
    sides = [d for d in (size if isinstance(size, (list, tuple)) else [size, size])
             if isinstance(d, int) and d > 0]
    if len(sides) != 2 and side:  # an encoder of any size (FastVLM's, Florence-2's)
        sides = [side, side]
    if len(sides) != 2 or not isinstance(channels, int):
        raise ConversionError(f"{where}: model_type {kind!r} gives no vision_config."
                              "image_size: give image_size (the side its images train at)")
    if side and [side, side] != sides:
        raise ConversionError(f"{where}: image_size {side}: model_type {kind!r} encodes "
                              f"images of {sides[0]} x {sides[1]} (its position table's): "
                              f"give {sides[0]}")
    held = _splits_per_image(inner)  # LLaVA's list an image: the graph holds the batch's
    return Images(torch.zeros(images if held else 1, channels, *sides), {}, sides, held)


def _sized(vision: Any) -> bool:
    """Whether `vision` (a vision config) builds an encoder of images of any size, each cut to
    its own by the image_sizes it is given (Pixtral's, Mistral 3's)."""
    from transformers.models.auto import modeling_auto as auto

    try:
        towers = auto.MODEL_MAPPING[type(vision)]
    except (KeyError, ValueError):
        return False
    return any("image_sizes" in inspect.signature(t.forward).parameters
               for t in (towers if isinstance(towers, tuple) else (towers,)) if t)


def _crosses(model: Any) -> bool:
    """Whether `model` (a class) reads its images as tiles by cross-attention."""
    return model is not None and CROSS in inspect.signature(model.forward).parameters


def _splits_per_image(inner: Any) -> bool:
    """Whether `inner`'s get_image_features turns its features into a list an image (LLaVA's
    `list(image_features)`): the export fixes that list's length."""
    return "list(image_features)" in features_code(inner)


def image_tokens(model: Any, images: Images, where: str) -> int:
    """How many token positions one image's features take in `model` (built on the meta
    device): its forward run until they are placed."""
    import torch

    if images.cross:  # its image token, and the tiles read by cross-attention
        return 1
    found: list[int] = []
    ids = torch.zeros(images.pixels.shape[0], 1, dtype=torch.long, device="meta")  # [B, 1]
    try:
        with placed(model, images, found=found, where=where), contextlib.suppress(_Counted):
            type(model).forward(model, **_inputs(model, images, images.pixels.to("meta"), ids, 0))
    except ConversionError:
        raise
    except Exception as e:  # its code needs values: the meta device has none
        raise ConversionError(
            f"{where}: {type(model).__name__}: its {images.noun} does not trace on the meta device "
            f"({type(e).__name__}: {str(e).splitlines()[0][:200]}): export the model itself "
            "with converters.from_torch") from None
    if not found:
        raise ConversionError(f"{where}: {type(model).__name__}: its {images.noun}'s features "
                              "never reach its text: export the model itself with "
                              "converters.from_torch")
    return found[0]


def placed_step(model: Any, images: Images, seq_len: int, where: str
                ) -> tuple[int, Any, tuple, list[str]]:
    """The tokens a sample's image (or audio) takes (`image_tokens`), and `model`'s training
    step with its features the first of `seq_len` tokens (`image_text_step`); a
    ConversionError where they take them all."""
    tokens = image_tokens(model, images, where)
    if seq_len <= tokens:
        raise ConversionError(f"{where}: seq_len {seq_len}: a sample's {images.noun} takes "
                              f"{tokens} of its tokens: give more")
    return tokens, *image_text_step(model, images, tokens, seq_len)


def _inputs(model: Any, images: Images, pixels: Any, ids: Any, tokens: int,
            token_types: Any = None) -> dict:
    """The forward's keyword inputs: the pixels (a grid encoder's patches flattened to
    [B P, ...] beside the grid's sizes), the token ids as their labels, the token types, and
    where its forward wants them, multimodal token types (Qwen-VL's: 1 an image's token)."""
    import torch

    flat = GRID in images.fixed or LISTS in images.fixed or images.chunks > 1
    kw = dict(images.fixed, input_ids=ids, labels=ids,
              **{images.key: pixels.flatten(0, 1) if flat else pixels})
    if token_types is not None:
        kw["token_type_ids"] = token_types
    takes = inspect.signature(type(model).forward).parameters
    if "mm_token_type_ids" in takes:
        image = torch.arange(ids.shape[1], device=ids.device) < tokens  # [T]
        kw["mm_token_type_ids"] = image.long().expand_as(ids)
    if "moe_mm_token_type_ids" in takes:  # ERNIE 4.5 VL's image tokens' own experts: values
        kw["moe_mm_token_type_ids"] = (torch.arange(ids.shape[1]) < tokens).long().expand(
            ids.shape[0], -1)  # [B, T], on the CPU: the experts' rows are the data's
    return kw


def image_text_step(model: Any, images: Images, tokens: int, seq_len: int
                    ) -> tuple[Any, tuple, list[str]]:
    """`model`'s training step on (pixel_values, input_ids [B, T]): the loss of every token,
    the image's features on the first `tokens` positions (`placed`); and where its forward
    reads token types (Gemma's: the image's tokens attend to each other, a mask PyTorch's
    attention is given), those [B, T] too, 1 the image's. The example's inputs (the images,
    the tokens at `seq_len`) and their names."""
    import torch

    forward = type(model).forward
    ids = torch.zeros(images.pixels.shape[0], seq_len, dtype=torch.long)  # [B, T]
    if images.cross:
        return _cross_step(model, images, ids)
    example: tuple = (images.pixels, ids)
    names = [images.key, "input_ids"]
    if "token_type_ids" in inspect.signature(forward).parameters:
        kinds = (torch.arange(seq_len) < tokens).long().expand_as(ids)  # [B, T]
        example, names = (*example, kinds), [*names, "token_type_ids"]

    def loss(self: Any, pixel_values: Any, input_ids: Any, *token_types: Any) -> Any:
        return forward(self, **_inputs(self, images, pixel_values, input_ids, tokens,
                                       *token_types)).loss

    return types.MethodType(loss, model), example, names


def _cross_step(model: Any, images: Images, ids: Any) -> tuple[Any, tuple, list[str]]:
    """`image_text_step` of a cross-attention model: the image token first, every token
    attending to every tile (an aspect ratio's id, its tiles' mask, the cross-attention
    mask [B, T, 1, tiles] as inputs)."""
    import torch

    forward, (b, t), n = type(model).forward, ids.shape, images.tiles
    ids[:, 0] = model.config.image_token_index
    # the ratio's id [B, 1] goes as [B, 1, 1]: not a rank-2 integer input, as token ids are
    ones = (torch.ones(*shape, dtype=torch.long) for shape in ((b, 1, 1), (b, 1, n), (b, t, 1, n)))
    example = (images.pixels, *ones, ids)
    names = ["pixel_values", CROSS, "aspect_ratio_mask", "cross_attention_mask", "input_ids"]

    def loss(self: Any, pixels: Any, ratio: Any, *inputs: Any) -> Any:
        return forward(self, **dict(zip(names, (pixels, ratio[..., 0], *inputs))),
                       labels=inputs[-1]).loss

    return types.MethodType(loss, model), example, names


@contextlib.contextmanager
def placed(model: Any, images: Images, tokens: int | None = None,
           found: list[int] | None = None, where: str = "") -> Iterator[None]:
    """`model` (a torch vision-language model) with the image features written into each
    sample's first `tokens` positions: `masked_scatter` of [B, N, d] or [B N, d] features into
    the [B, T, d] embeddings becomes a concatenation before the text's last T - N, the
    placeholder mask it is given one of the embeddings' shape, counted from no values;
    positions counted in order; Qwen3-VL's deepstack features added to the first N positions.
    With `found`, the forward stops there and N (of one image) is appended to it. A grid
    encoder's CPU values join the meta tensors on the meta device. Restored after."""
    import torch

    original = torch.Tensor.masked_scatter

    def features(source: Any, width: int) -> Any:  # [B, N, d]: B from the features
        return source.reshape(-1, tokens, width) if tokens else source.reshape(
            images.pixels.shape[0], -1, width)

    def scatter(self: Any, mask: Any, source: Any) -> Any:
        if found is not None and self.dim() == 3 and source.shape[-1] != self.shape[-1]:
            raise ConversionError(f"{where}: {type(model).__name__}: its image features are "
                                  f"{source.shape[-1]:,} wide, its text's embeddings "
                                  f"{self.shape[-1]:,}: its config's projector does not fit "
                                  "its language model")
        if self.dim() != 3 or source.shape[-1] != self.shape[-1]:
            return original(self, mask, source)  # not the features into the embeddings
        x = features(source, self.shape[-1])
        if found is not None:
            found.append(int(x.shape[1]))
            raise _Counted
        return torch.cat([x.to(self.dtype), self[:, x.shape[1]:]], dim=1)

    def mask(self: Any, input_ids: Any = None, inputs_embeds: Any = None, *args: Any,
             **kwargs: Any) -> Any:  # what masked_scatter ignores; Qwen's: images', videos'
        if inputs_embeds is None:  # Gemma 4's, of the ids: images', videos', audio's [B, T]
            b, t = input_ids.shape
            image = (torch.arange(t) < (tokens or t)).expand(b, t)  # values, on the CPU
            return image, torch.zeros_like(image), torch.zeros_like(image)
        ones = torch.ones_like(inputs_embeds, dtype=torch.bool)
        return (ones, ones) if "video_features" in inspect.signature(
            type(self).get_placeholder_mask).parameters else ones

    def positions(self: Any, input_ids: Any, *args: Any, **kwargs: Any) -> tuple[Any, Any]:
        b, t = input_ids.shape  # M-RoPE's three position ids [3, B, T], and no deltas
        return torch.arange(t).view(1, 1, t).expand(3, b, t), torch.zeros(b, 1, dtype=torch.long)

    def deepstack(self: Any, hidden: Any, masks: Any, visual: Any) -> Any:
        x = features(visual, hidden.shape[-1]).to(hidden.dtype)  # [B, N, d]
        return torch.cat([hidden[:, :x.shape[1]] + x, hidden[:, x.shape[1]:]], dim=1)

    patches: dict[str, Callable[..., Any]] = dict(
        get_placeholder_mask=mask, get_rope_index=positions, _deepstack_process=deepstack)
    held = [(m, name) for m in model.modules() for name in patches if hasattr(type(m), name)]
    if tiled := splits(inner := getattr(model, "model", model)):
        held.append((inner, "get_image_features"))
        patches["get_image_features"] = every_tile
    for m, name in held:
        setattr(m, name, types.MethodType(patches[name], m))
    torch.Tensor.masked_scatter = scatter  # type: ignore[method-assign]
    try:
        with meta_joins() if images.fixed or tiled else contextlib.nullcontext(), \
                _broadcast_masks(), _unchecked(model):
            yield
    finally:
        torch.Tensor.masked_scatter = original  # type: ignore[method-assign]
        for m, name in held:
            m.__dict__.pop(name, None)


def _unchecked(model: Any) -> Any:
    """`model`'s module without its check that the placeholders count its features (Gemma
    4's, of its placeholder mask's values: the features go first, `placed`), and with
    `unpad_image` (LLaVA-NeXT's) in Python's numbers, which the tracer gives as tensors."""
    code = sys.modules[type(model).__module__]
    return replaced(code, **{name: new for name, new in (
        ("torch_compilable_check", lambda *a, **k: None), ("unpad_image", unpadded))
        if hasattr(code, name)})


@contextlib.contextmanager
def _broadcast_masks() -> Iterator[None]:
    """transformers' attention masks built by broadcasting their index tensors where it would
    vmap the mask's function (Gemma 3's image blocks in its sliding-window layers): the same
    mask, in operators the TorchScript exporter traces (vmap's indexing mode it cannot); a
    padding mask on the meta device read as a traced one, whose values are not looked at
    (BLIP-2's Q-Former's mask of the image's patches, outside a trace: `image_tokens`)."""
    from transformers import masking_utils as masks

    broadcast = dict(  # what vmaps a mask's function -> the same, broadcast
        _vmap_expansion_sdpa=lambda f: lambda *at: f(*masks._non_vmap_expansion_sdpa(*at)),
        TransformGetItemToIndex=contextlib.nullcontext)
    if all(hasattr(masks, n) for n in [*broadcast, "_non_vmap_expansion_sdpa"]):
        traced = masks.is_tracing
        with replaced(masks, **broadcast, is_tracing=lambda t: traced(t) or getattr(
                getattr(t, "device", None), "type", "") == "meta"):
            yield
    else:  # another transformers: as it is
        yield
