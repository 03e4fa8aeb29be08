"""The random zoo (`measure.random_zoo`): a name always draws the same architecture, every
block kind, normalisation and activation of the grammar trains and exports, and `mdot profile
--zoo random` measures generated models."""

import json

import pytest

torch = pytest.importorskip("torch")

from converters import convert, from_torch  # noqa: E402
from mdot_jax.measure import random_zoo  # noqa: E402
from mdot_jax.measure.random_zoo import (  # noqa: E402
    ACTS,
    IMAGE_BLOCKS,
    KINDS,
    NORMS,
    SEQUENCE_BLOCKS,
    build,
    name_of,
    spec,
)


def _input(s, batch=2):
    if s["kind"] == "text":
        return torch.randint(0, 1000, (batch, s["size"]))
    if s["kind"] == "audio":
        return torch.randn(batch, 1, s["size"])
    return torch.randn(batch, 3, s["size"], s["size"])


def _trains_and_exports(s):
    model = build(s)
    x = _input(s)
    y = model(x)
    assert y.shape == (2, KINDS[s["kind"]])
    torch.nn.functional.cross_entropy(y, torch.zeros(2, dtype=torch.long)).backward()
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)
    seq = convert(from_torch(model, x), batch_size=3)
    assert seq.unknown_ops == {} and seq.meta["inputs"][next(iter(seq.meta["inputs"]))][0] == 3
    return seq


def test_a_name_always_draws_the_same_architecture():
    assert spec(name_of(3, 17)) == spec(name_of(3, 17)) == spec("rnd1-s3-00017")
    drawn = [json.dumps(spec(name_of(0, i)), sort_keys=True) for i in range(50)]
    assert len(set(drawn)) == 50
    assert {spec(name_of(0, i))["kind"] for i in range(50)} == set(KINDS)
    for bad in ("rnd0-s1-00001", "resnet18", "rnd1-s1"):
        with pytest.raises(ValueError, match="not a random-zoo model"):
            spec(bad)


def test_attention_and_token_mixing_only_over_few_positions():
    for i in range(200):
        s = spec(name_of(1, i))
        for stage, positions in zip(s["stages"], random_zoo._positions(
                s["kind"], s["size"], len(s["stages"]))):
            if positions > random_zoo.MAX_TOKENS:
                assert not {"attention", "mixer"} & set(stage), s


@pytest.mark.parametrize("block", IMAGE_BLOCKS)
def test_every_image_block_trains_and_exports(block):
    i = IMAGE_BLOCKS.index(block)
    _trains_and_exports(dict(kind="image", size=32, norm=NORMS[i % len(NORMS)],
                             act=ACTS[i % len(ACTS)], width=16, growth=1.5,
                             down=("max", "avg", "conv")[i % 3], stages=[[block], [block]]))


@pytest.mark.parametrize("block", SEQUENCE_BLOCKS)
@pytest.mark.parametrize("kind", ["text", "audio"])
def test_every_sequence_block_trains_and_exports(block, kind):
    i = SEQUENCE_BLOCKS.index(block)
    _trains_and_exports(dict(kind=kind, size=64 if kind == "text" else 1024,
                             norm=NORMS[i % len(NORMS)], act=ACTS[-1 - i % len(ACTS)],
                             width=8, growth=2, down=("max", "avg", "conv")[i % 3],
                             stages=[[block], [block]]))


@pytest.mark.slow
def test_generated_models_train_and_export():
    for i in range(12):
        _trains_and_exports(spec(name_of(7, i)))


def test_profile_measures_the_random_zoo(tmp_path, quiet_protocol):
    from mdot_jax.data.dataset import load_dataset
    from mdot_jax.measure.profiler import profile
    from mdot_jax.measure.zoo import find_model

    profile(["random:2:0"], [2], [999], tmp_path, threads=1, progress=False,
            protocol=quiet_protocol, speed_check=False)
    samples = load_dataset(tmp_path).samples
    assert {s.arch for s in samples} == {name_of(0, 0), name_of(0, 1)}
    for s in samples:  # each at the size its name draws, not the profile's
        assert s.workload.input_size == spec(s.arch)["size"]
        assert find_model(s.arch).kind == spec(s.arch)["kind"]
