"""The novel split: nothing novel is trained on, the held-out part is whole families, the
summary scores every method's error and band coverage on the novel architectures; distances
and distance-aware bands behave."""

import json

import numpy as np
import pytest

from mdot_jax.data.dataset import Dataset
from mdot_jax.data.novelty import DistanceBand, Novelty
from mdot_jax.data.splits import make_splits, with_novel


def _parts(ds, novel_families=("edgenext", "ese")):
    train = Dataset(ds.root, [s for s in ds.samples if s.family not in novel_families])
    novel = Dataset(ds.root, [s for s in ds.samples if s.family in novel_families])
    return train, novel


def test_with_novel_refuses_what_training_has(tiny_real_dataset):
    train, novel = _parts(tiny_real_dataset)
    with pytest.raises(ValueError, match="architectures also in"):
        with_novel(train, Dataset(novel.root, novel.samples + train.samples[:1]))
    import dataclasses

    twin = dataclasses.replace(train.samples[0], arch="renamed", key="renamed/x")
    with pytest.raises(ValueError, match="graphs also in"):
        with_novel(train, Dataset(novel.root, [twin]))


@pytest.mark.parametrize("kind", ["novel", "novel-zoo"])
def test_the_novel_split_trains_on_nothing_novel(tiny_real_dataset, kind):
    train, novel = _parts(tiny_real_dataset)
    ds = with_novel(train, novel)
    [(tr, te)] = make_splits(ds, kind)
    assert not set(tr) & set(te) and set(tr) | set(te) == set(range(len(ds)))
    trained = {ds.samples[i].arch for i in tr}
    assert not trained & set(novel.archs)
    assert all(ds.samples[i].meta.get("novel") for i in range(len(ds))
               if ds.samples[i].arch in novel.archs) and all(i in te for i in range(len(ds))
                                                              if ds.samples[i].meta.get("novel"))
    held = {ds.samples[i].family for i in te if not ds.samples[i].meta.get("novel")}
    assert held and not held & {ds.samples[i].family for i in tr}  # whole families


@pytest.mark.slow
def test_novel_summary_scores_every_method(tiny_real_dataset, tmp_path):
    from mdot_jax.evaluation.evaluate import run
    from mdot_jax.evaluation.novel import novel_summary

    ds = with_novel(*_parts(tiny_real_dataset))
    rows = run(ds, tmp_path, split="novel", methods=("analytic", "lightgbm"), progress=False)
    table = novel_summary(rows, ds, tmp_path, command="test", ensembles=["analytic+lightgbm"])
    result = json.loads((tmp_path / "results.json").read_text())
    pair = "ensemble(analytic+lightgbm)"
    assert set(result["methods"]) == {"analytic", "lightgbm", pair}
    for r in result["methods"].values():
        assert r["mape"] > 0 and 0 <= r["coverage"] <= 1 and r["n_novel"] == 4
        assert r["mape novel random"] is None
    assert "analytic" in table and (tmp_path / "error_vs_distance.png").stat().st_size > 0
    # the band a checkpoint of the pair ships with holds every member: at least where the
    # measured time lies between the two predictions
    preds = {r["method"]: dict(zip(r["test_keys"], r["pred_ms"])) for r in rows}
    between = [min(preds["analytic"][s.key], preds["lightgbm"][s.key]) <= s.label_ms
               <= max(preds["analytic"][s.key], preds["lightgbm"][s.key])
               for s in ds.samples if s.meta.get("novel")]
    assert result["methods"][pair]["coverage_shipped_band"] >= np.mean(between)
    assert "coverage_shipped_band" not in result["methods"]["lightgbm"]
    assert f"{pair}: the band it would ship with" in table


def test_distances_and_bands(tiny_real_dataset):
    train, novel = _parts(tiny_real_dataset)
    nov = Novelty.fit(train.samples)
    assert np.allclose(nov.distance(train.samples), 0)
    assert (nov.distance(novel.samples) > 0).all()
    rng = np.random.default_rng(0)
    d = rng.uniform(0, 4, 400)
    err = rng.normal(0, 0.05 * (1 + d))  # errors grow with distance
    band = DistanceBand.fit(d, err)
    assert band.widths == sorted(band.widths) and band.widths[-1] > 2 * band.widths[0]
    lo, hi = band.interval(np.ones(400), d)
    assert 0.75 <= np.mean((np.exp(err) >= lo) & (np.exp(err) <= hi)) <= 0.85
    assert band.width(np.array([2 * band.edges[-1]]))[0] == pytest.approx(2 * band.widths[-1])
    # far: beyond how far a family left out of the training data usually is
    fams = [s.family for s in train.samples]
    far = nov.far(fams)
    assert 0 < far <= nov.far(fams, quantile=1.0)
    assert (nov.distance(novel.samples) > 0).all() and np.isfinite(far)


@pytest.mark.slow
def test_bands_from_a_novel_split_come_from_its_held_out_part_alone(trained,
                                                                   tiny_real_dataset, tmp_path):
    """`calibrate` reads a novel split's results with its novel dataset, and fits the bands on
    the held-out part only: novel samples (here predicted 5x off) never calibrate."""
    import json

    from mdot_jax.evaluation.evaluate import calibrate
    from mdot_jax.storage import checkpoint

    train, novel = _parts(tiny_real_dataset)
    held = train.samples[:6]
    path = checkpoint.save(trained, tmp_path / "ckpt",
                           dataset=dict(fingerprint=train.fingerprint()))
    row = dict(method="mdot", fold=0, seed=0, split="novel",
               dataset=with_novel(train, novel).fingerprint(),
               test_keys=[s.key for s in held + novel.samples],
               pred_ms=[s.label_ms for s in held] + [5 * s.label_ms for s in novel.samples])
    (tmp_path / "results.jsonl").write_text(json.dumps(row))
    cal = calibrate(path, tmp_path, train, novel=novel)
    assert sum(b.n for bands in cal.bands.values() for b in bands) == len(held)
    assert all(abs(b.hi) < 1e-6 for bands in cal.bands.values() for b in bands)
    assert "held-out part of the novel split" in cal.source
    with pytest.raises(ValueError, match="name its novel dataset"):
        calibrate(path, tmp_path, train)
    (tmp_path / "results.jsonl").write_text(json.dumps(dict(row, split="family")))
    with pytest.raises(ValueError, match="not of one dataset"):
        calibrate(path, tmp_path, train, novel=novel)
