"""A vision-language model's config.json exported as its fine-tuning step on an image and text
(`converters.vision_language`)."""

import dataclasses
import json

import pytest
import torch

from converters import ConversionError, convert, from_hf_config
from converters.attention import attention_blocks, layer_starts, residuals
from mdot_jax import RequestError
from mdot_jax.gpu.model_parallel import layer_input
from mdot_jax.serving.model_facts import check_converted

GEMMA = dict(model_type="gemma", hidden_size=64, intermediate_size=128, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=1, head_dim=16, vocab_size=512)
SIGLIP = dict(model_type="siglip_vision_model", hidden_size=32, intermediate_size=64,
              num_hidden_layers=2, num_attention_heads=4, image_size=56, patch_size=14,
              projection_dim=64)
PALIGEMMA = dict(model_type="paligemma", text_config=GEMMA, vision_config=SIGLIP,
                 projection_dim=64, hidden_size=64, image_token_index=500)
INTERNVL = dict(model_type="internvl", downsample_ratio=0.5, image_token_id=500,
                text_config=dict(model_type="qwen2", hidden_size=64, intermediate_size=128,
                                 num_hidden_layers=2, num_attention_heads=4,
                                 num_key_value_heads=2, vocab_size=512),
                vision_config=dict(model_type="internvl_vision", hidden_size=32,
                                   intermediate_size=64, num_hidden_layers=2,
                                   num_attention_heads=4, image_size=[56, 56],
                                   patch_size=[14, 14]))


def _model(config: dict):
    import transformers

    with torch.device("meta"):
        return transformers.AutoModelForImageTextToText.from_config(
            transformers.AutoConfig.for_model(**config))


@pytest.mark.parametrize("config, tokens, typed", [(PALIGEMMA, 16, True), (INTERNVL, 4, False)])
def test_a_vision_language_config_trains_on_an_image_and_its_text(config, tokens, typed):
    """PaliGemma's and InternVL's configs were refused ("no causal, masked or
    sequence-to-sequence language model"): each sample is one image at its vision config's side
    and --seq-len tokens, the image's features the first of them, every token's loss."""
    graph = from_hf_config(config, seq_len=32)
    one, two, longer = (convert(graph, batch_size=b, seq_len=t) for b, t in
                        ((1, 32), (2, 32), (1, 64)))
    side = config["vision_config"]["image_size"]
    side = side[0] if isinstance(side, list) else side
    assert two.meta["inputs"] == dict(pixel_values=[2, 3, side, side], input_ids=[2, 32],
                                      **(dict(token_type_ids=[2, 32]) if typed else {}))
    assert two.flops == pytest.approx(2 * one.flops, rel=2e-3)  # an image and text a sample
    assert one.flops < longer.flops < 2.2 * one.flops  # the image's work stays
    model = _model(config)
    unread = one.meta.get("unread", {}).get("params", 0)  # SigLIP's pooling head
    assert one.params + unread == sum(p.numel() for p in model.parameters())
    assert one.meta["head"] == dict(head=type(model).__name__, labels=None, image=[side, side],
                                    image_tokens=tokens)


def test_token_types_give_the_language_model_a_mask_as_pytorchs_attention_is_given():
    """Gemma's image tokens attend to each other (token_type_ids): transformers hands SDPA a
    mask tensor, which runs its memory-efficient kernel over every key, not causal flash."""
    from converters.attention import attention_blocks

    seq = convert(from_hf_config(PALIGEMMA, seq_len=32), batch_size=2)
    text = [b for b in attention_blocks(seq) if "language_model" in seq.node_names[b.scores]]
    assert len(text) == GEMMA["num_hidden_layers"] and all(b.padded for b in text)
    # InternVL reads no token types: its language model's attention stays causal
    assert not any(b.padded for b in attention_blocks(
        convert(from_hf_config(INTERNVL, seq_len=32), batch_size=2)))


def test_the_prediction_says_what_a_sample_is_and_counts_its_tokens(tmp_path):
    from mdot_jax import TrainingJob, predict

    (tmp_path / "config.json").write_text(json.dumps(PALIGEMMA))
    p = predict(TrainingJob(model=str(tmp_path), seq_len=32, batch_size=2, device="h100-sxm",
                            precision="amp-bf16"))
    assert p.tokens == 32 and p.tokens_per_s == pytest.approx(p.samples_per_s * 32)
    said = [w for w in p.warnings if w.startswith("trained as")]
    assert said == ["trained as PaliGemmaForConditionalGeneration on one 56 x 56 image a "
                    "sample, its features the first 16 of the tokens, and every token's loss"]


def test_a_sequence_no_longer_than_its_image_is_refused():
    with pytest.raises(ConversionError, match=r"^config: seq_len 16: a sample's image takes "
                                              r"16 of its tokens: give more$"):
        from_hf_config(PALIGEMMA, seq_len=16)


def test_a_projector_that_does_not_fit_the_language_model_is_named():
    wide = dict(PALIGEMMA, projection_dim=96, vision_config=dict(SIGLIP, projection_dim=96))
    with pytest.raises(ConversionError, match=r"its image features are 96 wide, its text's "
                                              r"embeddings 64: its config's projector"):
        from_hf_config(wide, seq_len=32)


def test_a_model_that_tiles_its_images_by_the_data_is_refused_in_one_line():
    """Idefics2 masks its images' pixels, of sizes of the data's."""
    config = dict(model_type="idefics2", text_config=dict(num_hidden_layers=1),
                  vision_config=dict(num_hidden_layers=1))
    with pytest.raises(ConversionError, match="^config: model_type 'idefics2' tiles an image by "
                                              "its pixel_attention_mask.*export the model itself"
                       ) as e:
        from_hf_config(config, seq_len=32)
    assert "\n" not in str(e.value)
    # UDOP's (Mistral 4's, pi0's) config names an image-text model but no vision config: it
    # crashed with "'UdopConfig' object has no attribute 'vision_config'"
    with pytest.raises(ConversionError, match="^config: model_type 'udop' gives no "
                                              "vision_config: its images are not priced"):
        from_hf_config(dict(model_type="udop", num_layers=1, num_decoder_layers=1), seq_len=32)


LFM2_VL = dict(model_type="lfm2_vl", image_token_id=396, downsample_factor=2,
               projector_hidden_size=64,
               vision_config=dict(model_type="siglip2_vision_model", hidden_size=32,
                                  intermediate_size=64, num_hidden_layers=2,
                                  num_attention_heads=2, num_patches=256, patch_size=16),
               text_config=dict(model_type="lfm2", hidden_size=64, intermediate_size=128,
                                num_hidden_layers=2, num_attention_heads=2,
                                num_key_value_heads=1, vocab_size=512,
                                layer_types=["conv", "full_attention"]))


@pytest.mark.slow  # one family's case (the fast tier keeps its kin's): 3 minutes
def test_lfm2_vl_trains_on_the_patches_its_image_processor_makes(tmp_path):
    """LFM2-VL was refused as a tiling encoder: its image processor lists an image's patches
    padded to 1,024 (a 448-pixel image: 28 x 28 of 16 pixels, 196 tokens after its 2 x 2
    shuffle), or cuts a larger one into 512-pixel tiles beside the whole (1,024 pixels: 2 x 2
    and the whole, 5 x 256 tokens)."""
    from mdot_jax import TrainingJob, predict

    small, large = (convert(from_hf_config(LFM2_VL, seq_len=2048, image_size=side),
                            batch_size=1) for side in (448, 1024))
    assert small.meta["inputs"]["pixel_values"] == [1, 1, 1024, 768]
    assert small.meta["head"]["image_tokens"] == 196 and "tiles" not in small.meta["head"]
    head = large.meta["head"]
    assert (head["tiles"], head["tile"], head["image_tokens"]) == (5, 512, 1280)
    unread = small.meta.get("unread", {}).get("params", 0)  # its encoder's pooling head
    assert small.params + unread == sum(p.numel() for p in _model(LFM2_VL).parameters())
    path = tmp_path / "config.json"
    path.write_text(json.dumps(LFM2_VL))
    job = TrainingJob(model=str(path), seq_len=2048, batch_size=2, image_size=448,
                      device="h100-sxm")
    assert predict(job).iteration_ms > 0  # exported again at its batch of two images


SMOLVLM = dict(model_type="smolvlm", scale_factor=2, image_token_id=5,
               vision_config=dict(model_type="smolvlm_vision", hidden_size=32,
                                  intermediate_size=64, num_hidden_layers=2,
                                  num_attention_heads=2, image_size=64, patch_size=16),
               text_config=dict(model_type="llama", hidden_size=64, intermediate_size=128,
                                num_hidden_layers=2, num_attention_heads=2,
                                num_key_value_heads=1, vocab_size=256))


@pytest.mark.parametrize("kind", ["smolvlm", pytest.param("idefics3", marks=pytest.mark.slow)])
def test_smolvlm_trains_on_the_tiles_of_an_image_resized_to_the_size_asked(tmp_path, kind):
    """Idefics3 and SmolVLM were refused as tiling encoders (a batch's padding tiles dropped
    by their pixels' values). Their processors resize an image to a side (default 4 tiles), up
    to a whole number of tiles, and add the whole resized where there are several: at 100
    pixels, 2 x 2 tiles of 64 and the whole, each 4 x 4 patches shuffled 2 x 2 into 4 tokens."""
    from mdot_jax import TrainingJob, predict

    config = dict(SMOLVLM, model_type=kind, vision_config=dict(
        SMOLVLM["vision_config"], model_type=f"{kind}_vision"))
    seq = convert(from_hf_config(config, seq_len=64, image_size=100), batch_size=1, fuse=True)
    head = seq.meta["head"]
    assert (head["image"], head["tiles"], head["tile"], head["image_tokens"]) == \
        ([128, 128], 5, 64, 20)
    assert seq.meta["inputs"]["pixel_values"] == [1, 5, 3, 64, 64]
    assert seq.params == sum(p.numel() for p in _model(config).parameters())
    said = dict((m.key, m.value) for m in from_hf_config(config, seq_len=128).metadata_props)
    assert json.loads(said["mdot.head"])["tiles"] == 17  # 4 x 4 and the whole by default
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    job = TrainingJob(model=str(path), seq_len=64, batch_size=3, image_size=64,
                      device="h100-sxm")
    assert predict(job).iteration_ms > 0  # one tile, exported again at its batch of three
    odd = dict(config, vision_config=dict(config["vision_config"], image_size=48))
    with pytest.raises(ConversionError, match="a tile of 48 pixels is 3 patches of 16 a side, "
                                              "which its connector cannot shuffle 2 x 2"):
        from_hf_config(odd, seq_len=64)


QWEN = dict(model_type="qwen2_5_vl", image_token_id=500, video_token_id=501,
            vision_start_token_id=502,
            text_config=dict(model_type="qwen2_5_vl_text", hidden_size=64, intermediate_size=128,
                             num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                             vocab_size=512, rope_scaling=dict(type="mrope",
                                                               mrope_section=[2, 3, 3])),
            vision_config=dict(depth=2, hidden_size=32, intermediate_size=64, num_heads=4,
                               out_hidden_size=64, patch_size=14, spatial_merge_size=2,
                               temporal_patch_size=2, window_size=56, fullatt_block_indexes=[1],
                               in_chans=3))


def test_a_grid_encoders_graph_holds_the_batchs_images_and_converts_at_that_batch_alone():
    """Qwen2.5-VL's encoder indexes its patches by each image's grid (windows, rotary
    positions): it was refused; the graph now holds the images it is exported with, at any
    image side that is a whole number of its 28-pixel cells, and another batch is refused."""
    one, two = (from_hf_config(QWEN, seq_len=32, images=n, image_size=112) for n in (1, 2))
    a, b = convert(one, batch_size=1), convert(two, batch_size=2)
    assert b.meta["inputs"] == dict(pixel_values=[2, 64, 1176], input_ids=[2, 32])
    # what a checkpointed layer keeps: a layer's input (2 images' 64 patches of 32, 2 x 32
    # tokens of 64), its windows' attention together (a window's alone was read as a layer's)
    assert layer_input(b, attention_blocks(b)) == 2 * 64 * 32 == 2 * 32 * 64
    assert b.meta["head"]["images"] == 2 and b.meta["head"]["image_tokens"] == 16
    # its layers (FSDP's units, checkpointing's, a pipeline's) are its encoder's 2 blocks and
    # its text's 2, not the attention of each of 2 x 4 windows and of each image
    assert len(attention_blocks(b)) == 2 * 4 + 2 + 2 and len(layer_starts(b,
                                                                       attention_blocks(b))) == 4
    assert b.flops == pytest.approx(2 * a.flops, rel=2e-3)
    assert a.params == sum(p.numel() for p in _model(QWEN).parameters())
    with pytest.raises(ConversionError):  # its windows hold two images' patches
        convert(two, batch_size=3)
    check_converted(b, 2, image_size=112, seq_len=32)  # a plan's sequence: its image's side
    with pytest.raises(RequestError, match="image_size 120"):
        check_converted(b, 2, image_size=120)
    with pytest.raises(ConversionError, match=r"^config: image_size 120: model_type "
                                              r"'qwen2_5_vl' cuts images into cells of 28 "
                                              r"pixels: give a multiple$"):
        from_hf_config(QWEN, seq_len=32, image_size=120)


@pytest.mark.slow  # one family's case (the fast tier keeps its kin's): 3 minutes
def test_a_grid_encoder_trains_on_a_video_of_the_frames_asked(tmp_path):
    """A video of F frames is a grid encoder's grid over time, F / 2 patches deep (Qwen2.5-VL
    encodes 2 frames a patch, an image as its one frame twice): 8 frames at 56 pixels are
    4 x 4 x 4 patches, 16 tokens after its 2 x 2 merge, where the image took 4."""
    from mdot_jax import TrainingJob, predict

    image, video = (convert(from_hf_config(QWEN, seq_len=64, image_size=56, video_frames=f),
                            batch_size=1) for f in (None, 8))
    assert video.meta["inputs"]["pixel_values"] == [1, 4 * 16, 1176]
    assert (video.meta["head"]["image_tokens"], video.meta["head"]["frames"]) == (16, 8)
    assert image.meta["head"]["image_tokens"] == 4 and "frames" not in image.meta["head"]
    assert video.flops > image.flops and video.params == image.params
    with pytest.raises(ConversionError, match="video_frames 3: model_type 'qwen2_5_vl' "
                                              "encodes a video 2 frames a patch"):
        from_hf_config(QWEN, seq_len=64, video_frames=3)
    with pytest.raises(ConversionError, match="video_frames 4: model_type 'smolvlm' encodes "
                                              "images, not videos"):
        from_hf_config(SMOLVLM, seq_len=64, video_frames=4)
    with pytest.raises(ConversionError, match="video_frames 4: model_type 'gemma' reads no "
                                              "images or videos"):
        from_hf_config(GEMMA, seq_len=64, video_frames=4)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(QWEN))
    job = TrainingJob(model=str(path), seq_len=64, batch_size=2, image_size=56,
                      video_frames=8, device="h100-sxm")
    said = predict(job)
    assert any("on one video of 8 frames of 56 x 56 a sample, its features the first 16 of "
               "the tokens" in w for w in said.warnings)
    assert said.iteration_ms > predict(dataclasses.replace(job, video_frames=None)).iteration_ms
    with pytest.raises(RequestError, match="video_frames"):
        TrainingJob(model=str(path), seq_len=64, batch_size=2, video_frames=0)
    for name, huge in (("image_size", 100_000), ("video_frames", 10_000)):  # no example that big
        with pytest.raises(ConversionError, match=f"{name} {huge:,}: more than"):
            from_hf_config(QWEN, seq_len=64, **{name: huge})


TEXT = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, vocab_size=512, head_dim=16)
GRID_VISION = dict(depth=2, hidden_size=32, intermediate_size=64, num_heads=4,
                   out_hidden_size=64, spatial_merge_size=2, temporal_patch_size=2)
GLM4V = dict(model_type="glm4v", image_token_id=500, video_token_id=501,
             image_start_token_id=502, video_start_token_id=503,
             text_config=dict(model_type="glm4v_text", **TEXT, rope_parameters=dict(
                 rope_type="default", mrope_section=[1, 1, 2], partial_rotary_factor=0.5)),
             vision_config=dict(GRID_VISION, patch_size=14, image_size=112))
QWEN3 = dict(model_type="qwen3_vl", image_token_id=500, video_token_id=501,
             vision_start_token_id=502,
             text_config=dict(model_type="qwen3_vl_text", **TEXT, rope_scaling=dict(
                 rope_type="default", mrope_section=[2, 3, 3], mrope_interleaved=True)),
             vision_config=dict(GRID_VISION, patch_size=16, deepstack_visual_indexes=[0],
                                num_position_embeddings=64))


@pytest.mark.parametrize("config, side", [(GLM4V, 112),
                                          pytest.param(QWEN3, 128, marks=pytest.mark.slow)])
def test_glm4v_and_qwen3_vl_train_on_an_image_or_a_video(config, side):
    """GLM-4V's images did not export (its positions' table indexed by values the meta device
    zeroed: "Gather ... indices must be in [-rank, rank-1]"); its video path encodes a video as
    images of its patches over time, which Qwen3-VL's encoder attends to alike. An image of 8 x
    8 patches is 16 tokens, a video of 4 frames 2 such patches deep 32."""
    image, video = (convert(from_hf_config(config, seq_len=64, image_size=side,
                                           video_frames=f), batch_size=1) for f in (None, 4))
    assert (image.meta["head"]["image_tokens"], video.meta["head"]["image_tokens"]) == (16, 32)
    assert video.meta["inputs"]["pixel_values"][:2] == [1, 128]
    assert image.params == video.params == sum(p.numel() for p in _model(config).parameters())


@pytest.mark.slow  # one family's case (the fast tier keeps its kin's): 5-9 s
def test_a_grid_encoders_config_is_priced_at_the_batch_asked(tmp_path):
    from mdot_jax import TrainingJob, predict

    (tmp_path / "config.json").write_text(json.dumps(QWEN))
    job = TrainingJob(model=str(tmp_path), seq_len=32, batch_size=1, device="h100-sxm",
                      image_size=112, precision="amp-bf16")
    one, three = predict(job), predict(dataclasses.replace(job, batch_size=3))
    assert one.tokens == three.tokens == 32
    assert 1 < three.iteration_ms / one.iteration_ms < 3.5
    assert any("a kernel an image or window" in w for w in three.warnings)
    # the flash-attn package: a layer's 12 windows (3 images of 4) one varlen call, and the
    # full-attention layer's 3 images another
    package = predict(dataclasses.replace(job, batch_size=3, attention="flash_attention_2"))
    assert package.iteration_ms < three.iteration_ms
    assert any("15 looped over a split's pieces (windows, images) as 2 varlen calls" in w
               for w in package.warnings)
    # tensor parallelism is checked against its language model's heads (4, of 2 key-value
    # heads), not its encoder's first window's (4 over the batch: 0 heads at batch 8 passed)
    with pytest.raises(RequestError, match="^tp 4: does not divide the model's 2 key-value"):
        predict(dataclasses.replace(job, batch_size=8, gpus=4, tp=4))
    # context parallelism cuts a sample's tokens, its image's features among them: refused,
    # where it priced a whole image a GPU (or blamed --seq-len for the piece's length)
    for seq_len in (32, 256):
        with pytest.raises(RequestError, match="^cp 2: an image's or audio's features lie "
                                               "in its sequences") as e:
            predict(dataclasses.replace(job, seq_len=seq_len, gpus=2, cp=2))
        assert e.value.field == "cp"


LLAVA = dict(model_type="llava", image_token_index=500, vision_feature_layer=-1,
             text_config=dict(GEMMA, model_type="llama"),
             vision_config=dict(model_type="clip_vision_model", hidden_size=32,
                                intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                                image_size=56, patch_size=14, projection_dim=32))


def test_an_encoder_that_keeps_a_list_an_image_holds_the_batchs_images():
    """LLaVA splits its features into a list an image (`list(image_features)`): it was
    refused; its graph now holds the images it is exported with, like a grid encoder's."""
    graph = from_hf_config(LLAVA, seq_len=32, images=2)
    seq = convert(graph, batch_size=2)
    assert seq.meta["head"]["images"] == 2 and seq.meta["head"]["image_tokens"] == 16
    unread = seq.meta["unread"]  # CLIP's last norm: LLaVA reads a layer's hidden states
    assert unread["in"] == ["model.vision_tower.post_layernorm"]
    assert seq.params + unread["params"] == sum(p.numel() for p in _model(LLAVA).parameters())
    with pytest.raises(ConversionError):
        convert(graph, batch_size=3)


GEMMA3 = dict(model_type="gemma3", mm_tokens_per_image=4,
              text_config=dict(GEMMA, model_type="gemma3_text", sliding_window=4,
                               layer_types=["sliding_attention", "full_attention"]),
              vision_config=dict(SIGLIP, num_hidden_layers=1))


def test_a_causal_lm_that_reads_images_too_trains_on_them_when_an_image_size_is_asked(tmp_path):
    """Gemma 3 is a causal LM in transformers and a vision-language model: it was priced on
    its text alone whatever was asked (`--image-size 56` "does not apply"). Asked, a sample is
    an image and its text, the image's tokens attending to each other in its sliding-window
    layers too (a mask transformers built by vmap, which did not export)."""
    from mdot_jax import TrainingJob, predict

    text = convert(from_hf_config(GEMMA3, seq_len=32), batch_size=2)
    assert text.meta["inputs"] == dict(input_ids=[2, 32])
    assert text.meta["head"] == dict(head="Gemma3ForConditionalGeneration", labels=None,
                                     text_alone="56")
    seq = convert(from_hf_config(GEMMA3, seq_len=32, image_size=56), batch_size=2)
    assert seq.meta["inputs"] == dict(pixel_values=[2, 3, 56, 56], input_ids=[2, 32],
                                      token_type_ids=[2, 32])
    assert seq.meta["head"] == dict(head="Gemma3ForConditionalGeneration", labels=None,
                                    image=[56, 56], image_tokens=4)
    model = _model(GEMMA3)
    unread = seq.meta.get("unread", {}).get("params", 0)  # SigLIP's pooling head
    assert seq.params + unread == sum(p.numel() for p in model.parameters()) > \
        text.params + text.meta["unread"]["params"] - 1
    blocks = [b for b in attention_blocks(seq) if "language_model" in seq.node_names[b.scores]]
    assert len(blocks) == 2 and all(b.padded for b in blocks)  # both layers given the mask
    (tmp_path / "config.json").write_text(json.dumps(GEMMA3))
    p = predict(TrainingJob(model=str(tmp_path), seq_len=32, batch_size=2, device="h100-sxm"))
    assert "trained as Gemma3ForConditionalGeneration on its text alone; an image_size (56) " \
           "trains it on an image a sample too" in p.warnings
    # transformers will not run its class with the flash-attn package: it was priced
    with pytest.raises(RequestError, match=r"^attention flash_attention_2: transformers refuses "
                                           r"it for Gemma3ForConditionalGeneration") as e:
        predict(TrainingJob(model=str(tmp_path), seq_len=32, batch_size=2, device="h100-sxm",
                            precision="amp-bf16", attention="flash_attention_2"))
    assert e.value.field == "attention"


QWEN35 = dict(model_type="qwen3_5", text_config=dict(
    hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=1, head_dim=16, vocab_size=512,
    layer_types=["linear_attention", "full_attention"], linear_num_key_heads=2,
    linear_num_value_heads=2, linear_key_head_dim=16, linear_value_head_dim=16),
    vision_config=dict(hidden_size=32, intermediate_size=64, depth=1, num_heads=4,
                       patch_size=16, temporal_patch_size=2, out_hidden_size=64,
                       spatial_merge_size=2))


def test_qwen35_trains_on_its_grid_of_patches_when_an_image_size_is_asked():
    """Qwen3.5's language model is a causal LM of its own (priced on text, nothing said of
    images); asked for 64 px images, its grid encoder's, whose positions leave the query's
    heads unknown to the exporter's grouped-query attention (it refused)."""
    assert from_hf_config(QWEN35, seq_len=32).metadata_props  # text: its causal LM
    seq = convert(from_hf_config(QWEN35, seq_len=32, images=2, image_size=64), batch_size=2)
    assert seq.meta["inputs"] == dict(pixel_values=[2, 16, 3 * 2 * 16 * 16], input_ids=[2, 32])
    assert seq.meta["head"]["image_tokens"] == 4 and seq.meta["head"]["images"] == 2


GEMMA4 = dict(model_type="gemma4", text_config=dict(
    hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=2,
    num_key_value_heads=1, head_dim=32, vocab_size=512, layer_types=["full_attention"]),
    vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                       num_attention_heads=2, num_key_value_heads=2, head_dim=16))


def test_an_encoder_of_listed_patches_trains_on_the_image_size_asked(tmp_path):
    """Gemma 4's encoder takes an image as its 16-pixel patches listed with their places,
    pooled 3 x 3 into tokens: asked for an image, it said "set vision_config.image_size",
    which would not have helped. A 96-pixel image is 36 patches, 4 tokens; the pooling is a
    GEMM by the places' weights, as transformers runs it."""
    from mdot_jax import TrainingJob, predict

    text = dict((m.key, m.value) for m in from_hf_config(GEMMA4, seq_len=32).metadata_props)
    assert json.loads(text["mdot.head"])["text_alone"] == "a multiple of 48"  # any, pooled
    seq = convert(from_hf_config(GEMMA4, seq_len=32, images=2, image_size=96), batch_size=2)
    assert seq.meta["inputs"] == dict(input_ids=[2, 32], pixel_values=[2, 36, 3 * 16 * 16])
    assert seq.meta["head"]["image_tokens"] == 4 and "unread" not in seq.meta
    assert seq.params == sum(p.numel() for p in _model(GEMMA4).parameters())
    with pytest.raises(ConversionError, match=r"^config: image_size 100: model_type 'gemma4' "
                                              r"pools its 16-pixel patches 3 x 3: give a "
                                              r"multiple of 48$"):
        from_hf_config(GEMMA4, seq_len=32, image_size=100)
    (tmp_path / "config.json").write_text(json.dumps(GEMMA4))
    p = predict(TrainingJob(model=str(tmp_path), seq_len=32, batch_size=2, device="h100-sxm",
                            image_size=96, precision="amp-bf16"))
    assert any(w.startswith("trained as Gemma4ForConditionalGeneration on one 96 x 96 image")
               and "a kernel an image" not in w for w in p.warnings)  # one call: the batch's


def test_a_tensor_parallel_layer_all_reduces_its_own_residual_stream():
    """Tensor parallelism all-reduced every layer's [text tokens, the commonest width]:
    InternVL's encoder layers ([2 images x 17 patches, 32]) as its language model's
    ([2 x 32 tokens, 64])."""
    seq = convert(from_hf_config(INTERNVL, seq_len=32), batch_size=2)
    first = layer_starts(seq, attention_blocks(seq))
    assert residuals(seq, first) == [2 * 17 * 32] * 2 + [2 * 32 * 64] * 2


@pytest.mark.parametrize("config, side, pixels", [
    (GEMMA3, 56, [3, 56, 56]),  # a causal LM too: the image asked for
    (QWEN, 112, [64, 1176]),  # a grid's: its graph holds the batch's images
])
def test_mdot_convert_takes_a_configs_images_as_predict_does(tmp_path, capsys, config, side,
                                                             pixels):
    """`mdot convert` exported a config at one image and its default size: Gemma 3's
    --image-size "did not apply", a grid encoder's batch of 2 did not convert."""
    from mdot_jax.cli import main

    (tmp_path / "config.json").write_text(json.dumps(config))
    assert main(["convert", str(tmp_path / "config.json"), "--seq-len", "32", "--batch-size",
                 "2", "--image-size", str(side), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["inputs"]["pixel_values"] == [2, *pixels]
    assert summary["head"]["image"] == [side, side]


MLLAMA = dict(model_type="mllama", text_config=dict(
    hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
    num_key_value_heads=2, vocab_size=128256, cross_attention_layers=[1, 3]),
    vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                       num_global_layers=1, attention_heads=4, image_size=56, patch_size=14,
                       vision_output_dim=64, max_num_tiles=4, intermediate_layers_indices=[0]))


def test_llama_3_2_vision_trains_on_its_tiles_read_by_cross_attention(tmp_path):
    """Llama 3.2 Vision's text reads an image's tiles through cross-attention layers, not
    features in its tokens: it was priced on its text alone, `image_size` refused. Its
    processor pads every image to `max_num_tiles` tiles, which the encoder runs all of."""
    from mdot_jax import TrainingJob, predict
    from mdot_jax.serving.model_source import config_said

    said = dict((m.key, m.value) for m in from_hf_config(MLLAMA, seq_len=32).metadata_props)
    assert json.loads(said["mdot.head"])["text_alone"] == "56"  # offered, as the note says
    graph = from_hf_config(MLLAMA, seq_len=32, image_size=56)
    seqs = [convert(graph, batch_size=b, fuse=True) for b in (1, 2)]
    assert seqs[1].meta["inputs"] == dict(
        pixel_values=[2, 1, 4, 3, 56, 56], aspect_ratio_ids=[2, 1, 1], aspect_ratio_mask=[2, 1, 4],
        cross_attention_mask=[2, 32, 1, 4], input_ids=[2, 32])
    assert seqs[0].params == sum(p.numel() for p in _model(MLLAMA).parameters())
    assert seqs[1].flops == pytest.approx(2 * seqs[0].flops, rel=0.01)
    assert "4 tiles of 56 x 56" in " ".join(config_said(seqs[0]))
    path = tmp_path / "config.json"
    path.write_text(json.dumps(MLLAMA))
    p = predict(TrainingJob(model=str(path), seq_len=32, batch_size=2, image_size=56,
                            device="h100-sxm", gpus=2, tp=2, precision="amp-bf16"))
    assert p.iteration_ms > 0 and any("cross-attention layers read" in w for w in p.warnings)
    with pytest.raises(ConversionError, match="encodes tiles of 56 x 56, an image padded to 4"):
        predict(TrainingJob(model=str(path), seq_len=32, batch_size=2, image_size=112,
                            device="h100-sxm"))


LLAMA4 = dict(model_type="llama4", text_config=dict(
    model_type="llama4_text", hidden_size=64, intermediate_size=128, intermediate_size_mlp=256,
    num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
    vocab_size=512, num_local_experts=4, num_experts_per_tok=1, interleave_moe_layer_step=2),
    vision_config=dict(hidden_size=32, intermediate_size=128, num_hidden_layers=1,
                       num_attention_heads=4, image_size=56, patch_size=14,
                       vision_output_dim=64, projector_input_dim=64, projector_output_dim=64))


def test_llama4s_images_export_its_complex_rotary_as_pairs():
    """Llama 4's vision rotary is a complex buffer, which the exporter takes as no input
    ("ScalarType ComplexFloat is an unexpected tensor scalar type"): its images did not
    export, and its text-alone note offered an image size. Its experts are the language
    model's, in the text config (`num_local_experts`): the image path did not see them."""
    seq = convert(from_hf_config(LLAMA4, seq_len=32, image_size=56), batch_size=2, fuse=True)
    assert seq.params == sum(p.numel() for p in _model(LLAMA4).parameters())
    assert seq.meta["head"]["image_tokens"] == 4  # 4 x 4 patches, shuffled 2 x 2
    assert seq.meta["experts"]["experts"] == 4 and seq.meta["experts"]["layers"] == 1
    rotary = [i for i, n in enumerate(seq.node_names) if "vision_model" in n
              and seq.op_names[i] == "Sub"]  # the complex product's real part, per q and k
    assert len(rotary) == 2
    pairs = seq.config[rotary[0]]  # [B, patches + CLS, heads, head_dim / 2]
    assert pairs[3:7].tolist() == [2, 17, 4, 4]


def test_a_vision_language_models_experts_are_its_language_models():
    """Qwen3.5-MoE counts its experts in its text config: asked an image size, the prediction
    said nothing of them and refused `ep` ("the model has no experts to split")."""
    q35 = dict(model_type="qwen3_5_moe", text_config=dict(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=1, head_dim=16, vocab_size=512,
        layer_types=["linear_attention", "full_attention"], linear_num_key_heads=2,
        linear_num_value_heads=2, linear_key_head_dim=16, linear_value_head_dim=16,
        num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
        shared_expert_intermediate_size=32), vision_config=dict(
        hidden_size=32, intermediate_size=64, depth=1, num_heads=4, patch_size=16,
        temporal_patch_size=2, out_hidden_size=64, spatial_merge_size=2))
    seq = convert(from_hf_config(q35, seq_len=64, image_size=64), batch_size=1, fuse=True)
    said = seq.meta["experts"]
    assert (said["experts"], said["top_k"], said["layers"]) == (4, 2, 2)


MISTRAL3 = dict(model_type="mistral3", image_token_index=10, spatial_merge_size=2,
                text_config=dict(model_type="mistral", hidden_size=64, intermediate_size=128,
                                 num_hidden_layers=2, num_attention_heads=4,
                                 num_key_value_heads=2, head_dim=16, vocab_size=512),
                vision_config=dict(model_type="pixtral", hidden_size=32, intermediate_size=64,
                                   num_hidden_layers=2, num_attention_heads=4, head_dim=8,
                                   image_size=224, patch_size=14))


@pytest.mark.slow  # one family's case (the fast tier keeps its kin's): 3 minutes
def test_a_pixtral_encoder_takes_an_image_of_the_size_asked(tmp_path):
    """Mistral 3's Pixtral encoder cuts each image to its own size by `image_sizes` (values its
    code reads: `.tolist()`), and was refused as a tiling encoder. Its sizes are held in the
    graph (on the CPU, as a grid's), which converts at the batch it was exported at."""
    from mdot_jax import TrainingJob, predict

    graph = from_hf_config(MISTRAL3, seq_len=64, image_size=112)
    seq = convert(graph, batch_size=1, fuse=True)
    assert seq.params == sum(p.numel() for p in _model(MISTRAL3).parameters())
    assert seq.meta["head"]["image_tokens"] == 16 and seq.meta["head"]["images"] == 1  # 8 x 8 / 4
    path = tmp_path / "config.json"
    path.write_text(json.dumps(MISTRAL3))
    job = TrainingJob(model=str(path), seq_len=64, batch_size=2, image_size=112,
                      device="h100-sxm")
    assert predict(job).iteration_ms > 0  # exported again at its batch of two images
    with pytest.raises(ConversionError, match="any size up to 224, cut into cells of 28"):
        predict(dataclasses.replace(job, image_size=100))
    said = dict((m.key, m.value) for m in from_hf_config(MISTRAL3, seq_len=128).metadata_props)
    assert json.loads(said["mdot.head"])["image"] == [224, 224]  # the largest by default


LLAVA_NEXT = dict(model_type="llava_next", image_token_index=10,
                  image_grid_pinpoints=[[56, 56], [56, 112], [112, 56], [112, 112]],
                  text_config=dict(model_type="qwen2", hidden_size=64, intermediate_size=128,
                                   num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, vocab_size=512),
                  vision_config=dict(model_type="clip_vision_model", hidden_size=32,
                                     intermediate_size=64, num_hidden_layers=2,
                                     num_attention_heads=4, image_size=56, patch_size=14))


@pytest.mark.parametrize("kind, vision", [("llava_next", "clip_vision_model"),
                                          ("llava_onevision", "siglip_vision_model")])
def test_an_any_resolution_model_trains_on_the_tiles_of_the_image_size_asked(kind, vision):
    """LLaVA-NeXT and LLaVA-OneVision cut an image into a grid of tiles by its size (their
    `image_sizes`, values their code reads) beside the whole image resized: they were refused
    as tiling encoders. A 112-pixel image is a 2 x 2 grid of 56-pixel tiles and the whole,
    whose features (4 x 4 a tile, each row of the grid's ended by a newline) take 88 tokens."""
    config = dict(LLAVA_NEXT, model_type=kind,  # OneVision keeps every feature: no CLS
                  vision_config=dict(LLAVA_NEXT["vision_config"], model_type=vision))
    seq = convert(from_hf_config(config, seq_len=128, image_size=112), batch_size=1, fuse=True)
    head = seq.meta["head"]
    assert (head["tiles"], head["tile"], head["image_tokens"]) == (5, 56, 88)
    assert seq.meta["inputs"]["pixel_values"] == [1, 5, 3, 56, 56]
    unread = seq.meta.get("unread", {}).get("params", 0)  # past the layer its features leave
    assert seq.params + unread == sum(p.numel() for p in _model(config).parameters())


def test_a_models_image_experts_train_on_its_image_tokens():
    """ERNIE 4.5 VL routes its image's tokens to experts of their own (`vision_moe`, by a
    mask of the data): the export sent every token to the text experts, the image experts'
    parameters (6.8B of the default 29.4B) unpriced, silently. The mask is values: the image
    tokens, first, go to the image experts."""
    import torch
    import transformers

    ernie = dict(model_type="ernie4_5_vl_moe",
                 text_config=dict(hidden_size=256, intermediate_size=128, num_hidden_layers=2,
                                  num_attention_heads=2, num_key_value_heads=1, vocab_size=512,
                                  moe_num_experts=4, moe_k=2, moe_intermediate_size=[32, 16],
                                  moe_num_shared_experts=1, mlp_layer_types=["dense", "sparse"]),
                 vision_config=dict(depth=2, hidden_size=32, num_heads=2, intermediate_size=64))
    graph = from_hf_config(ernie, seq_len=128, image_size=112, images=2)
    seq = convert(graph, batch_size=2, fuse=True)
    with torch.device("meta"):
        model = transformers.AutoModelForImageTextToText.from_config(
            transformers.AutoConfig.for_model(**ernie))
    assert seq.params == sum(p.numel() for p in model.parameters())
    assert "unread" not in seq.meta


def test_a_model_whose_main_input_is_its_images_trains_on_an_image_and_text():
    """BLIP-2's (InstructBLIP's, Kosmos-2's) main input is its pixels: its config was refused
    with "trains on images of any size ... give image_size", and again with an image size
    given. Its Q-Former's mask of the image's patches, read outside a trace (counting its
    image tokens), no longer asks the meta device for values."""
    import torch
    import transformers

    blip2 = dict(model_type="blip-2", num_query_tokens=8,
                 vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                    num_attention_heads=2, patch_size=16),
                 qformer_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                     num_attention_heads=2, encoder_hidden_size=32),
                 text_config=dict(model_type="opt", hidden_size=64, ffn_dim=128,
                                  num_hidden_layers=2, num_attention_heads=4, vocab_size=512,
                                  word_embed_proj_dim=64))
    seq = convert(from_hf_config(blip2, seq_len=32), batch_size=2, fuse=True)
    assert seq.meta["inputs"] == {"input_ids": [2, 32], "pixel_values": [2, 3, 224, 224]}
    assert seq.meta["head"]["image_tokens"] == 8  # its queries
    with torch.device("meta"):
        model = transformers.AutoModelForImageTextToText.from_config(
            transformers.AutoConfig.for_model(**blip2))
    assert seq.params == sum(p.numel() for p in model.parameters())


def test_an_encoder_of_any_image_size_trains_at_the_size_asked():
    """Florence-2's (FastVLM's) vision config sizes no image: "set vision_config.image_size"
    was the error, and an image size given was refused the same way."""
    florence = dict(model_type="florence2",
                    vision_config=dict(depths=[1, 1, 1, 1], embed_dim=[16, 32, 32, 64],
                                       num_heads=[1, 2, 2, 4], num_groups=[1, 2, 2, 4],
                                       window_size=4, projection_dim=64),
                    text_config=dict(d_model=64, encoder_layers=1, decoder_layers=1,
                                     encoder_ffn_dim=128, decoder_ffn_dim=128,
                                     encoder_attention_heads=4, decoder_attention_heads=4,
                                     vocab_size=512))
    with pytest.raises(ConversionError, match="'florence2' gives no vision_config.image_size: "
                                              "give image_size"):
        from_hf_config(florence, seq_len=64)
    small, large = (convert(from_hf_config(florence, seq_len=64, image_size=side),
                            batch_size=2, fuse=True) for side in (128, 192))
    assert small.meta["inputs"]["pixel_values"] == [2, 3, 128, 128]
    assert (small.meta["head"]["image_tokens"], large.meta["head"]["image_tokens"]) == (17, 37)
    assert large.flops > small.flops


def test_a_graph_past_protobufs_limit_asks_for_a_smaller_image(monkeypatch):
    """Mistral 3's default config (Pixtral's 1,540-pixel images, 12,100 patches an image)
    holds a mask over a batch's patches past protobuf's 2 GB: the error said where the
    exporter wanted a file written and that the model "holds more than 4 GB to trace on the
    CPU", neither of which helps."""
    import torch

    from converters import from_torch

    def export(*args, **kwargs):
        raise RuntimeError("The serialized model is larger than the 2GiB limit imposed by the "
                           "protobuf library. Therefore the output file must be a file path")

    monkeypatch.setattr(torch.onnx, "export", export)
    with torch.device("meta"):
        model = torch.nn.Linear(4, 4)
    with pytest.raises(ConversionError, match=r"the 2GiB limit imposed by the protobuf "
                                              r"library; the values its graph holds .* a "
                                              r"smaller image_size or batch exports$"):
        from_torch(model, torch.zeros(2, 4, device="meta"))
