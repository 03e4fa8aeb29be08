"""The device core set and the probe: a fixed, versioned selection, measured like any sample."""

import json

import numpy as np

from mdot_jax.cli import main
from mdot_jax.measure import core_set


def test_the_stored_selection_follows_its_rules():
    chosen = core_set.load()
    core, probe = chosen["core_set"], chosen["probe"]
    families = {k.split("/")[0] for k in core}
    assert 140 <= len(core) <= 170 and chosen["families"] >= 40 and len(families) >= 40
    assert len(probe) == core_set.PROBE_SIZE and set(probe) <= set(core)
    assert len({k.split("/")[0] for k in probe}) == len(probe)  # one per family
    assert chosen["slowest_device_s"]["probe"] < 10  # labels: minutes with the protocol
    assert len(chosen["devices"]) >= 3


def test_kmeans_picks_distinct_rows_near_each_centre():
    rng = np.random.default_rng(0)
    x = np.concatenate([rng.normal(c, 0.01, (10, 2)) for c in (0.0, 5.0, 10.0)])
    picked = core_set._kmeans_nearest(x, 3, seed=0)
    assert len(set(picked)) == 3 and sorted(i // 10 for i in picked) == [0, 1, 2]


def test_probe_measures_its_samples_and_writes_them_down(tmp_path, capsys, quiet_protocol):

    keys = ["mobilenet_v3_small/i32/b2", "mobilenet_v3_small/i32/b4"]
    kw = dict(threads=1, protocol=quiet_protocol, speed_check=False)
    probe = core_set.run_probe(tmp_path, keys, **kw)
    assert json.loads((tmp_path / core_set.PROBE_FILE).read_text()) == probe
    assert list(probe["ms"]) == keys and all(v > 0 for v in probe["ms"].values())
    assert probe["fingerprint"]["threads"] == 1
    assert probe["version"] == core_set.CORE_SET_VERSION
    # what the folder holds is not measured again
    assert core_set.run_probe(tmp_path, keys, **kw) == probe
    # an unknown model is one line, before anything is measured
    assert main(["probe", "--out", str(tmp_path / "x"), "--keys", "no_such_net/i32/b2"]) == 2
    [line] = [x for x in capsys.readouterr().err.splitlines() if x.startswith("mdot")]
    assert line.startswith("mdot: error:") and "no_such_net/i32/b2" in line


def test_the_adaptation_order_starts_with_one_sample_of_each_family_outside_the_probe():
    chosen = core_set.load()
    order = core_set.adaptation_order(chosen)
    assert order == core_set.adaptation_order(chosen)  # fixed: a resumed run measures alike
    assert set(order) == set(chosen["core_set"]) - set(chosen["probe"])
    probed = {k.split("/")[0] for k in chosen["probe"]}
    archs = {k.split("/")[0] for k in chosen["core_set"]} - probed
    first = order[:len(archs)]
    assert {k.split("/")[0] for k in first} == archs  # one per family, each once
    assert all(k.endswith("/b8") for k in first[:10])  # the batch nearest 8
