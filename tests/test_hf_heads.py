"""An image classifier's config trains at the image size asked (`converters.hf_heads`)."""

import json

import pytest

from converters import ConversionError, convert, from_hf_config

VIT = dict(model_type="vit", architectures=["ViTForImageClassification"], hidden_size=64,
           num_hidden_layers=2, num_attention_heads=4, intermediate_size=128, image_size=64,
           patch_size=16, num_labels=10)
RESNET = dict(model_type="resnet", architectures=["ResNetForImageClassification"],
              embedding_size=16, hidden_sizes=[16, 32], depths=[1, 1], layer_type="basic",
              num_labels=5)


def test_a_vit_config_trains_at_the_image_size_asked(tmp_path):
    """`--image-size 96` for a ViT's config was refused ("a shape in the graph depends on the
    size it was exported at ... export again"): the config is ours to export, its position
    table built for the size asked, as fine-tuning at another resolution does."""
    from mdot_jax import TrainingJob, predict

    at64, at96 = (convert(from_hf_config(VIT, image_size=side), batch_size=2, fuse=True)
                  for side in (None, 96))
    assert at96.meta["inputs"] == {"pixel_values": [2, 3, 96, 96]}
    assert at96.meta["head"]["pixels"] == [96, 96]
    assert at96.params - at64.params == (36 - 16) * 64  # 20 more positions of 64
    assert at96.flops > 2 * at64.flops  # 37 tokens for 17
    (tmp_path / "config.json").write_text(json.dumps(VIT))
    job = dict(model=str(tmp_path / "config.json"), batch_size=2, device="h100-sxm")
    ms = [predict(TrainingJob(image_size=side, **job)) for side in (64, 96)]
    assert ms[1].iteration_ms > ms[0].iteration_ms
    assert any("at 96 x 96 pixels" in line for line in ms[1].warnings)


def test_a_cnn_config_that_sizes_no_image_asks_for_one(tmp_path):
    """A ResNet's config gives no image size (it trains at any): it was refused with "set
    image_size in the config"; `--image-size` now sizes it, and without one the error names
    the flag."""
    from mdot_jax import TrainingJob, predict

    with pytest.raises(ConversionError, match="'resnet' trains on images of any size, which its "
                                              "config does not give: give image_size"):
        from_hf_config(RESNET)
    small, large = (convert(from_hf_config(RESNET, image_size=side), batch_size=2, fuse=True)
                    for side in (32, 64))
    assert large.meta["inputs"] == {"pixel_values": [2, 3, 64, 64]}
    assert large.params == small.params and large.flops > 3.5 * small.flops
    with pytest.raises(ConversionError, match="image_size 100,000: give a side of 1 to 16,384"):
        from_hf_config(RESNET, image_size=100_000)
    (tmp_path / "config.json").write_text(json.dumps(RESNET))
    assert predict(TrainingJob(model=str(tmp_path / "config.json"), batch_size=4,
                               device="a100-sxm4-80gb", image_size=64)).iteration_ms > 0


def test_an_image_classifier_with_batch_statistics_of_one_dim_exports():
    """LeViT's head normalises [B, C] with BatchNorm1d, which refuses a batch of one image in
    training ("Expected more than 1 value per channel"): the example holds two."""
    levit = dict(model_type="levit", architectures=["LevitForImageClassification"],
                 image_size=64, hidden_sizes=[32, 48, 64], num_attention_heads=[2, 3, 4],
                 depths=[1, 1, 1], key_dim=[8, 8, 8], num_labels=5)
    seqs = [convert(from_hf_config(levit), batch_size=b, fuse=True) for b in (2, 8)]
    assert seqs[1].meta["inputs"] == {"pixel_values": [8, 3, 64, 64]}
    assert seqs[1].flops == pytest.approx(4 * seqs[0].flops, rel=0.02)


def test_a_clip_classifier_reads_its_vision_configs_image_size():
    """CLIP's and SigLIP's image classifiers size their images in their vision config: they
    were refused ("gives no image_size")."""
    clip = dict(model_type="clip", architectures=["CLIPForImageClassification"],
                vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                   num_attention_heads=2, image_size=32, patch_size=8),
                text_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                 num_attention_heads=2, vocab_size=64), num_labels=3)
    seq = convert(from_hf_config(clip), batch_size=2, fuse=True)
    assert seq.meta["inputs"] == {"pixel_values": [2, 3, 32, 32]}
    big = convert(from_hf_config(clip, image_size=64), batch_size=2, fuse=True)
    assert big.meta["head"]["pixels"] == [64, 64] and big.flops > 3 * seq.flops


def test_defaults_said_of_a_config_short_of_its_shape_name_lists_too():
    """A Swin's config that leaves its heads to transformers' defaults crashed the note
    ("unsupported format string passed to list.__format__"): its heads are a list a stage."""
    from types import SimpleNamespace

    from mdot_jax.serving.model_source import config_said

    seq = SimpleNamespace(meta=dict(defaulted={"hidden_size": 768,
                                               "num_attention_heads": [3, 6, 12, 24]}))
    assert config_said(seq) == ["the config gives no hidden_size, num_attention_heads: "
                                "transformers' defaults built the model (hidden_size 768, "
                                "num_attention_heads [3, 6, 12, 24])"]


VIDEOMAE = dict(model_type="videomae", architectures=["VideoMAEForVideoClassification"],
                hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                image_size=32, patch_size=16, num_frames=4, tubelet_size=2, num_labels=7)


def test_a_video_classifiers_config_trains_on_clips_of_the_frames_asked(tmp_path):
    """VideoMAE, TimeSformer, ViViT and V-JEPA 2 fine-tuned to classify clips
    (`...ForVideoClassification`) were refused ("has no causal, masked ... language model"):
    a clip of its config's frames and size a sample, or of `--video-frames` and
    `--image-size`, no `--seq-len`."""
    from mdot_jax import TrainingJob, predict
    from mdot_jax.serving.model_source import config_said

    seq = convert(from_hf_config(VIDEOMAE), batch_size=2, fuse=True)
    assert seq.meta["inputs"] == {"pixel_values": [2, 4, 3, 32, 32]}
    longer = convert(from_hf_config(VIDEOMAE, video_frames=8, image_size=64), batch_size=2,
                     fuse=True)
    assert longer.meta["inputs"] == {"pixel_values": [2, 8, 3, 64, 64]}
    assert longer.flops > 6 * seq.flops  # 64 tubelets for 8
    assert "at 64 x 64 pixels, 8 frames a clip" in config_said(longer)[0]
    with pytest.raises(ConversionError, match="video_frames 10,000: give 1 to 4,096 frames"):
        from_hf_config(VIDEOMAE, video_frames=10_000)
    (tmp_path / "config.json").write_text(json.dumps(VIDEOMAE))
    p = predict(TrainingJob(model=str(tmp_path / "config.json"), batch_size=2,
                            device="h100-sxm", video_frames=8, image_size=64))
    assert p.iteration_ms > 0  # no --seq-len wanted; --image-size sized in the graph
    with pytest.raises(ConversionError, match="'vit' classifies images, not videos"):
        from_hf_config(dict(model_type="vit", architectures=["ViTForImageClassification"]),
                       video_frames=8)


@pytest.mark.parametrize("kind, arch", [
    pytest.param("t5", "T5ForTokenClassification", marks=pytest.mark.slow),
    ("t5", "T5ForSequenceClassification"), ("bart", "BartForSequenceClassification"),
    pytest.param("t5", "T5ForQuestionAnswering", marks=pytest.mark.slow)])
def test_an_encoder_decoders_task_head_is_priced_not_its_language_model(kind, arch):
    """A T5's or BART's classifier config was priced as its language model (the vocabulary's
    projection and loss over every target token; T5's token classifier, an encoder alone, with
    a decoder too): silently. Its head is exported, its parameters transformers' own; the
    sequence classifiers read each sequence's end token, which the example ends with."""
    import torch
    import transformers

    config = dict(model_type=kind, d_model=64, d_ff=128, num_layers=2,
                  num_heads=2, d_kv=32, vocab_size=32000, encoder_layers=2, decoder_layers=2,
                  encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=128,
                  decoder_ffn_dim=128, architectures=[arch])
    seq = convert(from_hf_config(config, seq_len=64), batch_size=2, seq_len=64)
    with torch.device("meta"):
        model = getattr(transformers, arch)._from_config(
            transformers.AutoConfig.for_model(**config))
    assert seq.params == sum(p.numel() for p in model.parameters())
    assert seq.meta["head"]["head"] == arch
    lm = convert(from_hf_config(dict(config, architectures=[]), seq_len=64), batch_size=2,
                 seq_len=64)
    assert seq.flops < lm.flops / 5  # no 32,000-word projection of every token
    with pytest.raises(ConversionError, match=f"is a {arch}, trained on its labels"):
        from_hf_config(config, seq_len=64, target_len=8)


WAV2VEC2 = dict(model_type="wav2vec2", architectures=["Wav2Vec2ForCTC"], hidden_size=32,
                num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                conv_dim=[32] * 7, num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=2,
                vocab_size=32)


def test_a_speech_recognisers_ctc_config_trains_on_the_seconds_of_audio_asked(tmp_path):
    """wav2vec 2.0's, HuBERT's and WavLM's CTC configs were refused ("has no causal, masked
    ... language model"): a waveform of `--audio-seconds` a sample, a transcript of
    `--seq-len` tokens, its CTC loss one node."""
    from mdot_jax import RequestError, TrainingJob, predict
    from mdot_jax.serving.model_source import config_said

    with pytest.raises(ConversionError, match="trains on audio of any length: give "
                                              "audio_seconds"):
        from_hf_config(WAV2VEC2, seq_len=10)
    short, long = (convert(from_hf_config(WAV2VEC2, seq_len=10, audio_seconds=s), batch_size=2,
                           seq_len=10) for s in (1, 4))
    assert long.meta["inputs"] == {"input_values": [2, 64000], "labels": [2, 10]}
    assert "CTCLoss" in long.op_names and not long.unknown_ops
    assert long.flops == pytest.approx(4 * short.flops, rel=0.1)
    said = config_said(long)[0]
    assert "on 4 s of audio a sample (64,000 samples) (SpecAugment's masking" in said
    with pytest.raises(ConversionError, match="seq_len 100: 1 s of audio make 49 frames"):
        from_hf_config(WAV2VEC2, seq_len=100, audio_seconds=1)
    (tmp_path / "config.json").write_text(json.dumps(WAV2VEC2))
    job = dict(model=str(tmp_path / "config.json"), batch_size=2, device="h100-sxm")
    assert predict(TrainingJob(seq_len=10, audio_seconds=2, **job)).iteration_ms > 0
    with pytest.raises(RequestError, match="seq_len: required"):  # the transcript's tokens
        predict(TrainingJob(audio_seconds=2, **job))
    with pytest.raises(RequestError, match="cp 2: the model trains on images or audio"):
        predict(TrainingJob(seq_len=20, audio_seconds=2, gpus=2, cp=2, **job))  # (its transcript
        # was cut over two GPUs, its audio not)
    with pytest.raises(RequestError, match="audio_seconds -1: expected a positive number"):
        TrainingJob(seq_len=10, audio_seconds=-1, **job)


def test_an_audio_classifiers_config_needs_no_tokens_and_fixed_features_take_no_seconds(
        tmp_path):
    """An audio classifier (wav2vec 2.0's `...ForSequenceClassification`, AST's) trains on
    its audio and labels, no `--seq-len`; a spectrogram its config fixes (AST's 1,024 frames,
    Whisper's 30 s) takes no `--audio-seconds`, nor does a text model."""
    from mdot_jax import TrainingJob, predict

    classifier = dict(WAV2VEC2, architectures=["Wav2Vec2ForSequenceClassification"],
                      num_labels=5)
    (tmp_path / "config.json").write_text(json.dumps(classifier))
    p = predict(TrainingJob(model=str(tmp_path / "config.json"), batch_size=2,
                            device="h100-sxm", audio_seconds=1))
    assert p.iteration_ms > 0
    ast = dict(model_type="audio-spectrogram-transformer",
               architectures=["ASTForAudioClassification"], hidden_size=32,
               num_hidden_layers=2, num_attention_heads=2, intermediate_size=64, max_length=128,
               num_mel_bins=32)
    seq = convert(from_hf_config(ast), batch_size=2)
    assert seq.meta["inputs"] == {"input_values": [2, 128, 32]}
    with pytest.raises(ConversionError, match="pads every clip to its \\(128, 32\\) features"):
        from_hf_config(ast, audio_seconds=10)
    with pytest.raises(ConversionError, match="'vit' trains on no waveform"):
        from_hf_config(VIT, audio_seconds=10)


def test_a_feature_input_recogniser_trains_on_the_frames_of_the_seconds_asked():
    """Wav2Vec2-BERT's CTC reads stacked mel features (160 a frame, 50 frames a second), not a
    waveform: it was refused ("takes audio features its config does not size")."""
    from mdot_jax.serving.model_source import config_said

    bert = dict(model_type="wav2vec2-bert", architectures=["Wav2Vec2BertForCTC"],
                hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                intermediate_size=64, output_hidden_size=32, vocab_size=32)
    seq = convert(from_hf_config(bert, seq_len=10, audio_seconds=3), batch_size=2, seq_len=10)
    assert seq.meta["inputs"] == {"input_features": [2, 150, 160], "labels": [2, 10]}
    assert "on 3 s of audio a sample (150 frames of 160 features)" in config_said(seq)[0]


def test_layerdrop_skips_no_layer_of_the_graph():
    """wav2vec 2.0's configs skip each layer with a chance a step in training (`layerdrop`,
    0.1 by default): the trace froze one draw, so a config priced one layer fewer than another
    export of it, at random. Every layer is exported, the note says why."""
    import torch
    import transformers

    from mdot_jax.serving.model_source import config_said

    config = dict(WAV2VEC2, num_hidden_layers=4, layerdrop=0.9, mask_time_prob=0.0,
                  do_stable_layer_norm=True)
    with torch.device("meta"):
        model = transformers.Wav2Vec2ForCTC._from_config(
            transformers.AutoConfig.for_model(**config))
    want = sum(p.numel() for p in model.parameters())
    for _ in range(3):
        seq = convert(from_hf_config(config, seq_len=10, audio_seconds=1), batch_size=2,
                      seq_len=10)
        assert seq.params == want
    assert "layerdrop 0.9: every layer priced, none skipped (training skips 90% of them a " \
        "step on average)" in config_said(seq)
    m2m = dict(model_type="m2m_100", d_model=32, encoder_layers=2, decoder_layers=2,
               encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=64,
               decoder_ffn_dim=64, vocab_size=128, encoder_layerdrop=0.5)
    seq = convert(from_hf_config(m2m, seq_len=8), batch_size=2, seq_len=8)  # no head: said
    assert any(line.startswith("encoder_layerdrop 0.5: every layer") for line in config_said(seq))
    parakeet = dict(model_type="parakeet_ctc", architectures=["ParakeetForCTC"], vocab_size=32,
                    encoder_config=dict(hidden_size=32, num_hidden_layers=4,
                                        num_attention_heads=2, intermediate_size=64,
                                        subsampling_conv_channels=8, layerdrop=0.9))
    with torch.device("meta"):  # its encoder config's layerdrop
        model = transformers.ParakeetForCTC._from_config(
            transformers.AutoConfig.for_model(**parakeet))
    seq = convert(from_hf_config(parakeet, seq_len=10, audio_seconds=1), batch_size=2,
                  seq_len=10)
    assert seq.params == sum(p.numel() for p in model.parameters())


def test_a_segmenters_config_trains_on_a_class_a_pixel(tmp_path):
    """SegFormer, UperNet, MobileViT fine-tuned to segment (`...ForSemanticSegmentation`) were
    refused ("has no causal, masked ... language model"): images of `--image-size` (a
    SegFormer's config sizes none), their loss over a class a pixel."""
    from mdot_jax import TrainingJob, predict

    segformer = dict(model_type="segformer", architectures=["SegformerForSemanticSegmentation"],
                     hidden_sizes=[8, 16, 24, 32], decoder_hidden_size=32, num_labels=5)
    small, large = (convert(from_hf_config(segformer, image_size=side), batch_size=2, fuse=True)
                    for side in (64, 128))
    assert large.meta["inputs"] == {"pixel_values": [2, 3, 128, 128]}
    assert large.meta["head"]["pixels"] == [128, 128] and large.flops > 3.5 * small.flops
    (tmp_path / "config.json").write_text(json.dumps(segformer))
    assert predict(TrainingJob(model=str(tmp_path / "config.json"), batch_size=2,
                               device="h100-sxm", image_size=64)).iteration_ms > 0


SEAMLESS = dict(model_type="seamless_m4t", hidden_size=32, encoder_layers=2, decoder_layers=2,
                speech_encoder_layers=4, encoder_attention_heads=2, decoder_attention_heads=2,
                speech_encoder_attention_heads=2, encoder_ffn_dim=64, decoder_ffn_dim=64,
                speech_encoder_intermediate_size=64, vocab_size=128, t2u_vocab_size=32,
                speech_encoder_layerdrop=0.9)


@pytest.mark.parametrize("kind, fields, inputs", [
    ("moonshine", dict(hidden_size=32, intermediate_size=64, num_attention_heads=2,
                       num_key_value_heads=2, encoder_num_hidden_layers=2,
                       decoder_num_hidden_layers=2, vocab_size=128),
     {"input_values": [2, 32000], "labels": [2, 12]}),
    ("speech_to_text", dict(d_model=32, encoder_layers=2, decoder_layers=2,
                            encoder_attention_heads=2, decoder_attention_heads=2,
                            encoder_ffn_dim=64, decoder_ffn_dim=64, vocab_size=128),
     {"input_features": [2, 200, 80], "labels": [2, 12]})])
def test_a_speech_recogniser_of_any_length_trains_on_the_seconds_asked(kind, fields, inputs):
    """Transformers' speech-to-text models other than Whisper (Moonshine on a waveform,
    Speech2Text on filter banks; Canary, Seamless M4T, SpeechT5) were refused ("takes audio
    its config does not size"): they transcribe `--audio-seconds` of audio into `--seq-len`
    tokens; without the seconds the error names them."""
    import torch
    import transformers

    from mdot_jax.serving.model_source import config_said

    config = dict(model_type=kind, **fields)
    seq = convert(from_hf_config(config, seq_len=12, audio_seconds=2), batch_size=2, seq_len=12)
    assert seq.meta["inputs"] == inputs
    with torch.device("meta"):
        model = transformers.AutoModelForSpeechSeq2Seq.from_config(
            transformers.AutoConfig.for_model(**config))
    assert seq.params == sum(p.numel() for p in model.parameters())
    assert config_said(seq)[0].endswith("on 2 s of audio a sample (" + (
        "32,000 samples" if kind == "moonshine" else "200 frames of 80 features") +
        "), transcribed into its tokens: every token's loss")
    with pytest.raises(ConversionError, match=f"'{kind}' trains on audio of any length: give "
                                              "audio_seconds"):
        from_hf_config(config, seq_len=12)
    longer = convert(from_hf_config(config, seq_len=12, audio_seconds=4), batch_size=2,
                     seq_len=12)
    assert longer.flops > 1.5 * seq.flops


@pytest.mark.slow  # one family's case (the fast tier keeps its kin's): 3 minutes
def test_a_speech_and_text_model_trains_as_its_config_or_the_audio_asked_says():
    """Seamless M4T's config builds a text-to-text model and a speech recogniser: text, said,
    unless the audio or its architectures ask for speech; its speech encoder's own layerdrop
    (`speech_encoder_layerdrop`) froze a draw of its layers into the graph."""
    import torch
    import transformers

    from mdot_jax.serving.model_source import config_said

    text = convert(from_hf_config(SEAMLESS, seq_len=8), batch_size=2, seq_len=8)
    assert text.meta["inputs"] == {"input_ids": [2, 8]}
    assert config_said(text)[0] == ("trained as SeamlessM4TForTextToText on its text alone; "
                                    "audio_seconds trains SeamlessM4TForSpeechToText on audio "
                                    "a sample")
    with torch.device("meta"):
        model = transformers.SeamlessM4TForSpeechToText._from_config(
            transformers.AutoConfig.for_model(**SEAMLESS))
    for config, seconds in ((SEAMLESS, 1), (dict(SEAMLESS, architectures=[
            "SeamlessM4TForSpeechToText"]), None)):
        if seconds is None:  # its architectures ask for speech: then for the seconds
            with pytest.raises(ConversionError, match="give audio_seconds"):
                from_hf_config(config, seq_len=8)
            seconds = 1
        seq = convert(from_hf_config(config, seq_len=8, audio_seconds=seconds), batch_size=2,
                      seq_len=8)
        assert seq.meta["inputs"] == {"input_features": [2, 50, 160], "labels": [2, 8]}
        assert seq.params == sum(p.numel() for p in model.parameters())
        assert "speech_encoder_layerdrop 0.9: every layer priced, none skipped (training " \
            "skips 90% of them a step on average)" in config_said(seq)
    whisper = dict(model_type="whisper", architectures=["WhisperForAudioClassification"],
                   d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=2,
                   decoder_attention_heads=2, encoder_ffn_dim=64, decoder_ffn_dim=64,
                   vocab_size=128, num_mel_bins=80, max_source_positions=100, num_labels=4)
    seq = convert(from_hf_config(whisper), batch_size=2)  # a recogniser's head: its own note
    assert config_said(seq)[0].startswith("trained as WhisperForAudioClassification (the "
                                          "config's architectures), 4 labels, on 80 x 200")


# a dual encoder's small config (CLIP's: 64-pixel images, 77 positions)
CLIP = dict(model_type="clip", projection_dim=16,
            text_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                             num_attention_heads=2, vocab_size=512, max_position_embeddings=77),
            vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                               num_attention_heads=2, image_size=64, patch_size=16))


def test_a_dual_encoders_config_trains_on_image_text_pairs(tmp_path):
    """CLIP's, SigLIP's, ALIGN's configs were refused ("has no causal, masked ... language
    model"): they train on image-text pairs, the loss contrasting each pair with the batch's
    others (a B x B matrix of similarities, exported at the batch), at their vision configs'
    image size or `--image-size`."""
    import torch
    import transformers

    from mdot_jax import RequestError, TrainingJob, predict
    from mdot_jax.serving.model_source import config_said

    clip = CLIP
    two, four = (convert(from_hf_config(clip, seq_len=16, images=b), batch_size=b, fuse=True)
                 for b in (2, 4))
    assert four.meta["inputs"] == {"input_ids": [4, 16], "pixel_values": [4, 3, 64, 64]}
    with torch.device("meta"):
        model = transformers.AutoModelForZeroShotImageClassification.from_config(
            transformers.AutoConfig.for_model(**clip))
    assert two.params == sum(p.numel() for p in model.parameters())
    assert four.flops == pytest.approx(2 * two.flops, rel=0.01)
    assert config_said(two) == ["trained as CLIPModel on image-text pairs, 64 x 64 pixels and "
                                "the tokens asked, its loss contrasting each pair with the "
                                "batch's others"]
    (tmp_path / "config.json").write_text(json.dumps(clip))
    p = predict(TrainingJob(model=str(tmp_path / "config.json"), seq_len=16, batch_size=4,
                            image_size=96, device="h100-sxm"))  # exported again at the batch
    assert any("on image-text pairs, 96 x 96 pixels" in w for w in p.warnings)
    with pytest.raises(RequestError, match="^cp 2: the model trains on images or audio, which "
                       "no ring cuts; context parallelism is priced for language models alone"):
        predict(TrainingJob(model=str(tmp_path / "config.json"), seq_len=16, batch_size=4,
                            device="h100-sxm", gpus=2, cp=2))  # its text alone was cut, unsaid
    with pytest.raises(ConversionError, match="'siglip2' takes its images as lists of patches"):
        from_hf_config(dict(model_type="siglip2"), seq_len=16, image_size=224)


def test_a_class_the_architectures_name_is_built_or_its_substitute_said():
    """A BERT config naming `BertForMaskedLM` was built as BERT's causal LM, the first of its
    language models; one naming a head not priced from a config
    (`BertForNextSentencePrediction`) was priced as that language model, unsaid."""
    from mdot_jax.serving.model_source import config_said

    bert = dict(model_type="bert", hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                intermediate_size=128, vocab_size=512)
    said = {arch: config_said(convert(from_hf_config(dict(bert, architectures=[arch]),
                                                     seq_len=32), batch_size=2))
            for arch in ("BertForMaskedLM", "BertLMHeadModel", "BertForNextSentencePrediction")}
    assert said["BertForMaskedLM"] == said["BertLMHeadModel"] == []  # each built as named
    assert said["BertForNextSentencePrediction"] == [
        "its architectures name BertForNextSentencePrediction, which is not priced from a "
        "config: trained as BertLMHeadModel, its language model"]


def test_a_multiple_choice_config_reads_each_choice_as_its_own_sequence(tmp_path):
    """A `...ForMultipleChoice` config (SWAG's, RACE's fine-tuning) was priced as its language
    model (a head over the vocabulary, one sequence a sample): it reads 4 choices a sample
    (`num_choices` in the config gives another count), each its own sequence of the tokens
    asked, and its loss a class a sample; tokens/s counts every choice's tokens."""
    import torch
    import transformers

    from mdot_jax import TrainingJob, predict
    from mdot_jax.serving.model_source import config_said

    bert = dict(model_type="bert", hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                intermediate_size=128, vocab_size=512, architectures=["BertForMultipleChoice"])
    four, two = (convert(from_hf_config(dict(bert, **extra), seq_len=32), batch_size=2,
                         fuse=True) for extra in ({}, dict(num_choices=2)))
    assert four.meta["inputs"] == {"input_ids": [2, 32]}  # [B, T], each choice's the same
    assert four.flops == pytest.approx(2 * two.flops, rel=0.01)
    with torch.device("meta"):
        model = transformers.BertForMultipleChoice(transformers.AutoConfig.for_model(**bert))
    assert four.params == sum(p.numel() for p in model.parameters())
    assert config_said(four) == [
        "trained as BertForMultipleChoice (the config's architectures), 4 choices a sample, "
        "each its own sequence of the tokens asked (num_choices in the config gives another "
        "count): its head and loss, not a language model's"]
    with pytest.raises(ConversionError, match="num_choices 1: give 2 to 64 choices a sample"):
        from_hf_config(dict(bert, num_choices=1), seq_len=32)
    (tmp_path / "config.json").write_text(json.dumps(bert))
    p = predict(TrainingJob(model=str(tmp_path / "config.json"), seq_len=32, batch_size=2,
                            device="h100-sxm"))
    assert p.tokens_per_s == pytest.approx(p.samples_per_s * 4 * 32)


def test_self_supervised_image_pretraining_trains_on_the_patches_its_mask_leaves(tmp_path):
    """ViT-MAE's, VideoMAE's and SimMIM's (ViT, DeiT, Swin, FocalNet
    `...ForMaskedImageModeling`) configs were refused ("has no causal, masked ... language
    model"): MAE's encoder runs on the patches its random mask leaves (`mask_ratio`: a quarter
    at 0.75), its decoder on all; VideoMAE's on a tenth of its clip's tubes; SimMIM's on every
    patch, the masked ones its mask token."""
    import torch
    import transformers

    from mdot_jax import TrainingJob, predict
    from mdot_jax.serving.model_source import config_said

    vit = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
               image_size=64, patch_size=8)
    mae = dict(vit, model_type="vit_mae", architectures=["ViTMAEForPreTraining"],
               decoder_hidden_size=32, decoder_intermediate_size=64, decoder_num_hidden_layers=1,
               decoder_num_attention_heads=4)
    quarter, half = (convert(from_hf_config(dict(mae, mask_ratio=r)), batch_size=2, fuse=True)
                     for r in (0.75, 0.5))
    with torch.device("meta"):
        model = transformers.ViTMAEForPreTraining(transformers.AutoConfig.for_model(**mae))
    assert quarter.params == sum(p.numel() for p in model.parameters())
    assert quarter.meta["inputs"] == {"pixel_values": [2, 3, 64, 64]}
    assert half.flops > 1.3 * quarter.flops  # twice the encoder's patches
    assert "its encoder on the patches its random mask leaves (0.75 masked, its mask_ratio)" in \
        config_said(quarter)[0]
    mim = dict(vit, model_type="vit", architectures=["ViTForMaskedImageModeling"], encoder_stride=8)
    seq = convert(from_hf_config(mim, image_size=96), batch_size=2, fuse=True)
    assert seq.meta["inputs"] == {"pixel_values": [2, 3, 96, 96]} and not seq.unknown_ops
    assert "its masked patches replaced by its mask token" in config_said(seq)[0]
    video = dict(vit, model_type="videomae", architectures=["VideoMAEForPreTraining"],
                 num_frames=4, decoder_hidden_size=32, decoder_intermediate_size=64,
                 decoder_num_hidden_layers=1, decoder_num_attention_heads=4)
    clips = [convert(from_hf_config(video, video_frames=n), batch_size=2, fuse=True)
             for n in (4, 8)]  # its visible tubes picked by boolean indexing: CPU values
    assert clips[1].meta["inputs"] == {"pixel_values": [2, 8, 3, 64, 64]}
    assert clips[1].flops > 1.1 * clips[0].flops
    assert "on the tubes its random mask leaves (0.9 masked, the VideoMAE paper's" in \
        config_said(clips[0])[0]
    (tmp_path / "config.json").write_text(json.dumps(mae))
    p = predict(TrainingJob(model=str(tmp_path / "config.json"), batch_size=64,
                            device="h100-sxm", precision="amp-bf16"))  # no seq_len asked
    assert p.parameters == quarter.params and p.iteration_ms > 0


def test_a_detectors_config_trains_on_boxes_matched_to_its_queries(tmp_path, monkeypatch):
    """DETR's and its kin's configs (`...ForObjectDetection`) were refused ("has no causal,
    masked ... language model"): they train on `OBJECTS` boxes an image, matched to their
    queries (the matching, scipy's, on the CPU: the first queries here, the cost matrix still
    computed), each image's targets a list the loss walks: the graph holds its batch."""
    import scipy.optimize
    import torch
    import transformers
    from transformers.loss import loss_for_object_detection as detr_loss

    from converters import from_torch
    from converters.detection import OBJECTS
    from converters.patches import matched_queries
    from mdot_jax import TrainingJob, predict
    from mdot_jax.serving import model_source

    detr = dict(model_type="detr", architectures=["DetrForObjectDetection"],
                backbone="resnet18", num_queries=10, d_model=32, encoder_layers=1,
                decoder_layers=1, encoder_attention_heads=2, decoder_attention_heads=2,
                encoder_ffn_dim=64, decoder_ffn_dim=64)
    two, four = (convert(from_hf_config(detr, image_size=64, images=b), batch_size=b, fuse=True)
                 for b in (2, 4))
    with torch.device("meta"):
        model = transformers.DetrForObjectDetection(transformers.AutoConfig.for_model(**detr))
    assert two.params == sum(p.numel() for p in model.parameters()) and not two.unknown_ops
    assert two.meta["inputs"] == {"pixel_values": [2, 3, 64, 64]}
    assert four.flops == pytest.approx(2 * two.flops, rel=0.05)
    with pytest.raises(ConversionError, match="holds the images or audio of a batch of 2"):
        convert(from_hf_config(detr, image_size=64, images=2), batch_size=4)
    with matched_queries(torch):
        assert torch.diag(torch.eye(3)).tolist() == [1.0, 1.0, 1.0]
    assert torch.diag(torch.ones(2)).shape == (2, 2)  # restored, as the solver is:
    assert detr_loss.linear_sum_assignment is scipy.optimize.linear_sum_assignment
    (tmp_path / "config.json").write_text(json.dumps(detr))
    exported = model_source._export_child
    asked: list[str] = []  # the images each export's graph holds (its argv's 7th)
    monkeypatch.setattr(model_source, "_export_child",
                        lambda argv: asked.append(argv[6]) or exported(argv))
    p = predict(TrainingJob(model=str(tmp_path / "config.json"), batch_size=3, image_size=64,
                            device="h100-sxm"))
    assert asked == ["3"]  # exported once, at the batch (not at one image first)
    yours = transformers.DetrForObjectDetection(transformers.AutoConfig.for_model(
        **detr, use_pretrained_backbone=False))  # a user's own, exported with its labels: the
    targets = [dict(class_labels=torch.tensor([1, 0]), boxes=torch.full((2, 4), 0.5))
               for _ in range(2)]  # GIoU's `diag` had no ONNX form

    class Step(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.detr = yours

        def forward(self, pixel_values, labels):
            return self.detr(pixel_values=pixel_values, labels=labels).loss

    mine = convert(from_torch(Step(), (torch.randn(2, 3, 64, 64), targets)), batch_size=2)
    assert mine.params == two.params and not mine.unknown_ops
    assert any(f"{OBJECTS} boxes an image, matched to its queries" in w for w in p.warnings)
    with pytest.raises(ConversionError, match="give image_size"):  # its config sizes none
        from_hf_config(detr)


RT_DETR = dict(model_type="rt_detr", architectures=["RTDetrForObjectDetection"],
               backbone_config=dict(model_type="rt_detr_resnet", embedding_size=16,
                                    hidden_sizes=[16, 32, 64, 128], depths=[1, 1, 1, 1],
                                    layer_type="basic",
                                    out_features=["stage2", "stage3", "stage4"]),
               encoder_in_channels=[32, 64, 128], d_model=32, encoder_hidden_dim=32,
               encoder_ffn_dim=64, decoder_ffn_dim=64, decoder_layers=2, num_queries=10,
               num_denoising=16, encoder_attention_heads=2, decoder_attention_heads=2,
               decoder_in_channels=[32, 32, 32])


@pytest.mark.slow
def test_a_real_time_detectors_config_trains_with_its_denoising_queries():
    """RT-DETR's config (and v2's, D-FINE's, DEIM's, which share its denoising groups) was
    refused: its groups' attention mask assigns empty runs, its noised labels draw integers
    shaped as a mask, its noised boxes' branches read folded sizes. RF-DETR's windowed
    backbone at a side its windows do not divide: one line naming the multiple."""
    import torch
    import transformers

    seq = convert(from_hf_config(RT_DETR, image_size=64, images=2), batch_size=2, fuse=True)
    with torch.device("meta"):
        model = transformers.RTDetrForObjectDetection(transformers.AutoConfig.for_model(
            **RT_DETR))
    assert seq.params == sum(p.numel() for p in model.parameters())
    assert seq.meta["inputs"] == {"pixel_values": [2, 3, 64, 64]}
    assert seq.op_type_counts().get("GridSample") == 2 * 3  # deformable attention: a layer,
    assert not seq.unknown_ops  # a feature level, its samples counted
    rf = dict(model_type="rf_detr", architectures=["RfDetrForObjectDetection"])
    with pytest.raises(ConversionError, match=r"image_size 640: its backbone cuts the image's "
                       r"14-pixel patches into 4 x 4 windows: give a multiple of 56"):
        from_hf_config(rf, image_size=640)


@pytest.mark.slow
@pytest.mark.parametrize("kind,fields", [
    ("DFine", dict(model_type="d_fine")),  # its zero weights' NaN boxes: its own initial ones
    ("Deimv2", dict(model_type="deimv2")),
    ("LwDetr", dict(model_type="lw_detr", projector_scale_factors=[1.0],  # its matcher offsets
                    num_feature_levels=1)),  # each group's queries by a traced size
])
def test_the_real_time_detectors_kin_train_from_their_configs(kind, fields):
    """D-FINE's, DEIMv2's and LW-DETR's defaults (2 decoder layers, 10 queries), each at the
    parameters its model trains (LW-DETR's default backbone feeds its neck from its ninth of
    ten layers: the last takes no gradient)."""
    import torch
    import transformers

    cfg = dict(fields, architectures=[f"{kind}ForObjectDetection"], decoder_layers=2,
               num_queries=10)
    seq = convert(from_hf_config(cfg, image_size=128, images=2), batch_size=2, fuse=True)
    with torch.device("meta"):
        model = getattr(transformers, f"{kind}ForObjectDetection")(
            transformers.AutoConfig.for_model(**cfg))
    last = (f"layer.{model.config.backbone_config.num_hidden_layers - 1}."
            if kind == "LwDetr" else "-")
    assert seq.params == sum(p.numel() for n, p in model.named_parameters() if last not in n)
    assert seq.meta["inputs"] == {"pixel_values": [2, 3, 128, 128]}


@pytest.mark.slow  # one family's case (the fast tier keeps its kin's): 5-9 s
def test_a_mask_segmenters_config_trains_on_masks_matched_to_its_queries():
    """Mask2Former's and MaskFormer's configs (`...ForUniversalSegmentation`,
    `...ForInstanceSegmentation`) were refused: they train on `OBJECTS` masks an image,
    matched to their queries as a detector's boxes are (their own matcher's scipy patched
    too), the graph holding its batch; OneFormer's, which reads its task's text beside its
    images, raised an AttributeError: one line now."""
    import torch
    import transformers

    from mdot_jax.serving.model_source import config_said

    m2f = dict(model_type="mask2former", architectures=["Mask2FormerForUniversalSegmentation"],
               backbone_config=dict(model_type="swin", embed_dim=16, depths=[1, 1, 1, 1],
                                    num_heads=[1, 1, 2, 2], image_size=64,
                                    out_features=["stage1", "stage2", "stage3", "stage4"]),
               hidden_dim=32, mask_feature_size=32, feature_size=32, num_queries=10,
               decoder_layers=2, encoder_layers=1, dim_feedforward=64, num_attention_heads=2,
               encoder_feedforward_dim=64)
    seq = convert(from_hf_config(m2f, image_size=64, images=2), batch_size=2, fuse=True)
    with torch.device("meta"):
        model = transformers.Mask2FormerForUniversalSegmentation(
            transformers.AutoConfig.for_model(**m2f))
    assert seq.params == pytest.approx(sum(p.numel() for p in model.parameters()), rel=0.01)
    assert seq.meta["inputs"] == {"pixel_values": [2, 3, 64, 64]}
    assert "8 masks an image, matched to its queries" in config_said(seq)[0]
    with pytest.raises(ConversionError, match="'oneformer' trains on pixel_values and "
                       "task_inputs together: not priced from a config"):
        from_hf_config(dict(model_type="oneformer",
                            architectures=["OneFormerForUniversalSegmentation"]), image_size=64)
