"""An audio-language model's config trains on the audio asked and its text
(`converters.audio_language`)."""

import json

import pytest

from converters import ConversionError, convert, from_hf_config

TEXT = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, vocab_size=512)
AUDIO = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
             num_mel_bins=16, max_source_positions=100)  # a chunk: 16 x 200 frames, 2 s
VOXTRAL = dict(model_type="voxtral", audio_config=dict(AUDIO, intermediate_size=256),
               text_config=TEXT)


def test_an_audio_language_models_config_trains_on_its_audio_and_text(tmp_path):
    """Voxtral's config was refused ("has no causal, masked, sequence-to-sequence or
    image-text-to-text language model"): it trains on `--audio-seconds` of audio a sample, in
    its Whisper encoder's chunks, their features the first of the `--seq-len` tokens."""
    import torch
    import transformers

    from mdot_jax import TrainingJob, predict
    from mdot_jax.errors import RequestError
    from mdot_jax.serving.model_source import config_said

    one, two = (convert(from_hf_config(VOXTRAL, seq_len=200, audio_seconds=s, images=2),
                        batch_size=2, fuse=True) for s in (1, 3))
    assert one.meta["inputs"] == {"input_features": [2, 16, 200], "input_ids": [2, 200]}
    assert two.meta["inputs"] == {"input_features": [2, 2, 16, 200], "input_ids": [2, 200]}
    assert "images" not in two.meta["head"]  # several chunks: any batch converts
    assert convert(from_hf_config(VOXTRAL, seq_len=200, audio_seconds=3), batch_size=3,
                   fuse=True).flops == pytest.approx(1.5 * two.flops, rel=0.01)
    with torch.device("meta"):
        model = transformers.AutoModelForSpeechSeq2Seq.from_config(
            transformers.AutoConfig.for_model(**VOXTRAL))
    assert one.params == two.params == sum(p.numel() for p in model.parameters())
    assert two.flops > 1.2 * one.flops  # a second chunk encoded
    assert config_said(one)[0] == (
        "trained as VoxtralForConditionalGeneration on 1 s of audio a sample (a chunk of 16 x "
        "200 features: its processor pads it to whole chunks), its features the first 25 of "
        "the tokens, and every token's loss")
    with pytest.raises(ConversionError, match="'voxtral' trains on audio of any length: give "
                                              "audio_seconds .* chunks of 2 s"):
        from_hf_config(VOXTRAL, seq_len=200)
    with pytest.raises(ConversionError, match="seq_len 20: a sample's audio takes 25 of its "
                                              "tokens: give more"):
        from_hf_config(VOXTRAL, seq_len=20, audio_seconds=1)
    (tmp_path / "config.json").write_text(json.dumps(VOXTRAL))
    job = dict(model=str(tmp_path / "config.json"), seq_len=200, batch_size=2,
               device="h100-sxm")
    p = predict(TrainingJob(audio_seconds=3, **job))  # exported again at the batch
    assert p.iteration_ms > 0 and any("2 chunks of 16 x 200" in w for w in p.warnings)
    with pytest.raises(RequestError, match="cp 2: an image's or audio's features lie in "
                                           "its sequences"):
        predict(TrainingJob(audio_seconds=1, cp=2, gpus=2, **job))


@pytest.mark.slow  # one family's case (the fast tier keeps its kin's): 3 minutes
def test_an_encoder_that_masks_padding_places_the_audios_features_alone(tmp_path):
    """Audio Flamingo 3's encoder takes a mask of each chunk's frames and keeps the features of
    the audio's, not of its last chunk's padding: 3 s in chunks of 2 s are 75 tokens (4 s: 100).
    Its graph holds the mask's values: converted at another batch, it is named."""
    from mdot_jax import TrainingJob, predict

    config = dict(model_type="audioflamingo3", audio_config=AUDIO, text_config=TEXT)
    tokens = [convert(from_hf_config(config, seq_len=200, audio_seconds=s, images=2),
                      batch_size=2).meta["head"]["audio_tokens"] for s in (1, 3, 4)]
    assert tokens == [25, 75, 100]
    graph = from_hf_config(config, seq_len=200, audio_seconds=3)  # its mask's values: held
    with pytest.raises(ConversionError, match="the graph holds the images or audio of a batch "
                                              "of 1 .*: convert it at batch 1, or export it "
                                              "again at batch 2"):
        convert(graph, batch_size=2)  # (a shape inference failure at some node)
    (tmp_path / "config.json").write_text(json.dumps(config))  # exported again at the batch
    assert predict(TrainingJob(model=str(tmp_path / "config.json"), seq_len=200,
                               audio_seconds=3, batch_size=2, device="h100-sxm")).iteration_ms


def test_a_causal_lm_that_hears_trains_on_its_text_unless_audio_is_asked():
    """MOSS-Transcribe-Diarize's config builds a causal LM too: its text alone, said, unless
    `--audio-seconds` asks for audio (its audio tower was left unpriced, unsaid). An omni model
    priced on images and text says audio is not (it said "trains on no waveform")."""
    from mdot_jax.serving.model_source import config_said

    config = dict(model_type="moss_transcribe_diarize", audio_config=AUDIO, text_config=TEXT)
    text = convert(from_hf_config(config, seq_len=32), batch_size=2)
    assert text.meta["inputs"] == {"input_ids": [2, 32]}
    assert config_said(text)[0].endswith(
        "on its text alone; audio_seconds trains MossTranscribeDiarizeForConditionalGeneration "
        "on audio a sample")
    heard = convert(from_hf_config(config, seq_len=200, audio_seconds=1, images=2),
                    batch_size=2)
    assert set(heard.meta["inputs"]) == {"input_features", "input_ids"}
    assert heard.params > text.params  # its audio tower trained too
    with pytest.raises(ConversionError, match="'qwen2_5_omni_thinker' is priced on images and "
                                              "text: audio beside them is not"):
        from_hf_config(dict(model_type="qwen2_5_omni_thinker"), seq_len=64, audio_seconds=1)
