"""The hand-written novel set (`measure.novel_zoo`): every model trains, exports, and converts
at another batch size exactly as if exported at that size; none is a zoo or random-zoo model."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from converters import convert, from_torch  # noqa: E402
from mdot_jax.measure import novel_zoo  # noqa: E402

CLASSES = {"image": 1000, "text": 2, "audio": 10}


def _input(kind, size, batch):
    g = torch.Generator().manual_seed(0)
    if kind == "text":
        return torch.randint(0, 1000, (batch, size), generator=g)
    if kind == "audio":
        return torch.randn(batch, 1, size, generator=g)
    return torch.randn(batch, 3, size, size, generator=g)


FAST = ("nv-unet", "nv-gmlp", "nv-conformer")  # one of each kind of input; the rest slow


@pytest.mark.parametrize("name", [n if n in FAST else pytest.param(n, marks=pytest.mark.slow)
                                  for n in sorted(novel_zoo.MODELS)])
def test_every_novel_model_trains_and_exports_at_any_batch(name):
    kind, size = novel_zoo.MODELS[name]
    model = novel_zoo.build(name)
    y = model(_input(kind, size, 2))
    assert y.shape == (2, CLASSES[kind])
    torch.nn.functional.cross_entropy(y, torch.zeros(2, dtype=torch.long)).backward()
    assert all(p.grad is not None for p in model.parameters())
    seq = convert(from_torch(model, _input(kind, size, 2)), batch_size=5)
    assert seq.unknown_ops == {}
    direct = convert(from_torch(model, _input(kind, size, 5)), batch_size=5)
    assert seq.num_ops == direct.num_ops
    np.testing.assert_allclose(seq.load.sum(0), direct.load.sum(0), rtol=1e-6)


def test_the_novel_set_is_its_own():
    from mdot_jax.measure.zoo import ZOOS, find_model

    assert len(novel_zoo.MODELS) >= 12
    others = {m.name for z in ZOOS if z != "novel" for m in ZOOS[z]()}
    assert not set(novel_zoo.MODELS) & others
    m = find_model("nv-wavenet")
    assert (m.kind, m.sizes) == ("audio", (4000,))
