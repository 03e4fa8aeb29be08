"""The committed local datasets (data/*/): every sample is a real, repeated measurement."""

from pathlib import Path

import pytest

from mdot_jax.data.dataset import has_sequence, load_dataset

DATA = Path(__file__).resolve().parents[1] / "data"
FOLDERS = sorted({p.parent for p in DATA.glob("*/samples.jsonl*")})  # packed too


@pytest.mark.slow  # seconds per folder: every sample's sequence is read
@pytest.mark.parametrize("folder", FOLDERS, ids=[f.name for f in FOLDERS])
def test_committed_local_dataset(folder):
    ds = load_dataset(folder)
    assert len(ds) > 0
    for s in ds.samples:
        assert s.label_ms > 0 and s.stats["repeats"] >= 3, s.key
        assert len(s.stats["times_ms"]) == s.stats["repeats"]
        assert s.stats["iqr_ms"] >= 0 and s.stats["cv"] >= 0
        fp = s.meta["fingerprint"]
        assert fp["device_model"] and fp["threads"] >= 1 and fp["torch"], s.key
        assert s.workload.device == folder.name  # one device per folder
        assert has_sequence(folder, s.seq_path), s.seq_path
    # every sample's sequence loads and matches its batch size
    s = ds.samples[0]
    assert next(iter(s.seq.meta["inputs"].values()))[0] == s.workload.batch_size
