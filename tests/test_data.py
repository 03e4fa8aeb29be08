"""Dataset format: family rule, crash-safe appends, resumable builders, identical splits."""

import json

import numpy as np
import pytest
from onnx_builders import conv_bn_relu

from converters import convert
from mdot_jax.cli import main
from mdot_jax.data import dataset
from mdot_jax.data.dataset import PACKED_SEQS, SEQS, Sample, Workload, family_of, load_dataset
from mdot_jax.data.splits import family_folds, make_splits, random_folds, split_validation
from mdot_jax.data.store import DatasetWriter, check_dataset, pack_sequences
from mdot_jax.errors import DatasetError


@pytest.mark.parametrize("arch,family", [
    ("resnet50d", "resnet"), ("tf_efficientnet_b0", "efficientnet"),
    ("vit_base_patch16_224", "vit"), ("mobilenetv3_large_100", "mobilenet"),
    ("mobilenet_v3_small", "mobilenet"), ("regnety_040", "regnety"), ("bert-base", "bert"),
    ("gpt2-tiny", "gpt"), ("tv_resnet50", "resnet"), ("resnetv2_50", "resnet"),
    ("adv_inception_v3", "inception"), ("ens_adv_inception_resnet_v2", "inception"),
])
def test_family_rule(arch, family):
    assert family_of(arch) == family


def make_dataset(root, archs=("resnet18", "resnet50", "vit_b", "vgg11", "alexnet",
                              "densenet121", "convnext_t"), batches=(2, 8, 32), twins=(),
                 label=lambda arch, b: float(b)):
    """Each arch gets its own operator graph (a toy conv block exported at another batch
    size), except the `twins`, which share the first arch's."""
    writer = DatasetWriter(root)
    for n, a in enumerate(archs):
        seq = writer.save_seq(a, convert(conv_bn_relu(), batch_size=2 + n)) if a not in twins \
            else f"{SEQS}/{archs[0]}.npz"
        for b in batches:
            writer.append(Sample(key=f"{a}/b{b}", arch=a, seq_path=seq,
                                 workload=Workload(batch_size=b, input_size=32),
                                 label_ms=label(a, b), stats=dict(cv=1.0, repeats=3)))
    return writer


def test_writer_round_trip_and_duplicate_key(tmp_path):
    make_dataset(tmp_path)
    ds = load_dataset(tmp_path)
    assert len(ds) == 21 and ds.samples[0].seq.num_ops == 3
    assert ds.summary()["num_families"] == 6  # resnet18 and resnet50 share a family
    writer = DatasetWriter(tmp_path)
    with pytest.raises(ValueError, match="already"):
        writer.append(ds.samples[0])


def test_torn_last_line_is_dropped_and_resume_adds_it_once(tmp_path):
    make_dataset(tmp_path, archs=("a1",), batches=(2, 4))
    path = tmp_path / "samples.jsonl"
    good = path.read_bytes()
    path.write_bytes(good + b'{"key": "a1/b8", "arch": "a1", "se')  # killed mid-write
    assert len(load_dataset(tmp_path)) == 2  # readers ignore the torn line
    make_dataset_resumed = DatasetWriter(tmp_path)  # opening for append repairs the file
    assert path.read_bytes() == good and make_dataset_resumed.done == {"a1/b2", "a1/b4"}
    keys = [json.loads(line)["key"] for line in path.read_text().splitlines()]
    assert keys == ["a1/b2", "a1/b4"]


def test_family_folds_never_share_a_family_and_cover_everything(tmp_path):
    make_dataset(tmp_path)
    ds = load_dataset(tmp_path)
    folds = family_folds(ds, k=3, seed=0)
    assert sorted(np.concatenate([te for _, te in folds]).tolist()) == list(range(len(ds)))
    for train, test in folds:
        fam_train = {ds.samples[i].family for i in train}
        fam_test = {ds.samples[i].family for i in test}
        assert fam_train.isdisjoint(fam_test) and len(test) > 0
    # deterministic: same folds every call (every method sees identical folds)
    again = make_splits(ds, "family", 3, seed=0)
    assert all((a[1] == b[1]).all() for a, b in zip(folds, again))


def test_family_folds_keep_identical_graphs_together(tmp_path):
    """DeiT and ViT are one network under two names: a fold never tests one while it trains
    on the other, whatever the fold count."""
    make_dataset(tmp_path, archs=("vit_t", "resnet18", "vgg11", "deit_t", "alexnet"),
                 twins=("deit_t",))
    ds = load_dataset(tmp_path)
    assert [s.family for s in ds.samples].count("deit") == 3  # families stay as named
    for k in (2, 3, 4):
        for _, test in family_folds(ds, k=k, seed=0):
            tested = {ds.samples[i].family for i in test}
            assert ("vit" in tested) == ("deit" in tested)


def test_family_validation_carve_out_holds_back_whole_families(tmp_path):
    """`val_by="family"`: validation families (twins merged) never train; the random-sample
    carve-out is unchanged (a random 10%, seeded)."""
    make_dataset(tmp_path, archs=("vit_t", "resnet18", "vgg11", "deit_t", "alexnet",
                                  "densenet121", "convnext_t", "regnety_002"),
                 twins=("deit_t",))
    samples = load_dataset(tmp_path).samples  # 7 families (resnet, vgg, ...), 24 samples
    for seed in range(6):
        train, val = split_validation(samples, 0.25, seed, by="family")
        fam_val = {s.family for s in val}
        assert fam_val.isdisjoint(s.family for s in train)
        assert ("vit" in fam_val) == ("deit" in fam_val)
        assert len(val) >= 6 and len(train) + len(val) == len(samples)
    train, val = split_validation(samples, 0.25, 0)
    assert len(val) == 6 and {s.family for s in val} & {s.family for s in train}
    assert split_validation(samples, 0.25, 0)[1] == val
    with pytest.raises(ValueError, match="2 families"):
        split_validation(samples[:3], 0.5, 0, by="family")


def test_twins_measure_label_noise(tmp_path, capsys):
    """ViT measured 10% slower than its twin DeiT: predicting each by the other errs 10% and
    1/1.1 - 1 = 9.1%; ResNet has no twin; a dataset without twins says so (None)."""
    make_dataset(tmp_path, archs=("deit_t", "resnet18", "vit_t"), twins=("vit_t",),
                 label=lambda arch, b: b * (1.1 if arch == "vit_t" else 1.0))
    twins = load_dataset(tmp_path).summary()["twins"]
    assert twins["samples"] == 6
    assert twins["mape"] == pytest.approx((10 + 100 * (1 - 1 / 1.1)) / 2)
    assert main(["dataset", "info", str(tmp_path)]) == 0
    assert "6 samples have a twin" in capsys.readouterr().out
    make_dataset(tmp_path / "none")
    assert load_dataset(tmp_path / "none").twin_agreement() is None
    # a kit's folder comes back without its sequences: summarised, their absence said
    for seq in (tmp_path / "seqs").glob("*.npz"):
        seq.unlink()
    capsys.readouterr()
    assert main(["dataset", "info", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "samples without their operator sequence" in out and "have a twin" not in out


def test_random_and_batch_splits(tmp_path):
    make_dataset(tmp_path)
    ds = load_dataset(tmp_path)
    folds = random_folds(ds, k=5, seed=1)
    assert sorted(np.concatenate([te for _, te in folds]).tolist()) == list(range(len(ds)))
    assert all(np.intersect1d(tr, te).size == 0 for tr, te in folds)
    [(train, test)] = make_splits(ds, "batch")
    assert {ds.samples[i].workload.batch_size for i in test} == {32}
    assert {ds.samples[i].workload.batch_size for i in train} == {2, 8}
    with pytest.raises(ValueError, match="unknown split"):
        make_splits(ds, "nope")


def _arrays(seq):
    return [seq.op_type, seq.config, seq.load, seq.edges, seq.node_names]


def test_packed_sequences_read_as_before_and_new_ones_join_on_the_next_pack(tmp_path, capsys):
    make_dataset(tmp_path, archs=("a1", "a2", "a3"))
    before = {s.key: _arrays(s.seq) for s in load_dataset(tmp_path).samples}
    assert main(["dataset", "pack", str(tmp_path)]) == 0
    assert "3 sequences (3 packed now)" in capsys.readouterr().out
    assert not list((tmp_path / SEQS).glob("*.npz")) and (tmp_path / PACKED_SEQS).is_file()
    # the samples file is packed too, and reads as before
    assert not (tmp_path / "samples.jsonl").exists()
    assert (tmp_path / "samples.jsonl.xz").is_file()
    first = (tmp_path / PACKED_SEQS).read_bytes()
    dataset.clear_sequence_cache()
    ds = load_dataset(tmp_path)
    for s in ds.samples:
        for a, b in zip(_arrays(s.seq), before[s.key], strict=True):
            np.testing.assert_array_equal(a, b)
    assert check_dataset(tmp_path)["problems"] == []
    writer = DatasetWriter(tmp_path)  # a packed dataset takes new samples as files
    assert writer.has_seq("a1") and not writer.has_seq("a4")
    make_dataset(tmp_path, archs=("a4",))  # appended to the unpacked samples: none lost
    assert [p.name for p in (tmp_path / SEQS).iterdir()] == ["a4.npz"]
    assert len(load_dataset(tmp_path)) == 12 and (tmp_path / "samples.jsonl").is_file()
    pack_sequences(tmp_path, progress=False)
    assert not list((tmp_path / SEQS).glob("*.npz")) and len(load_dataset(tmp_path)) == 12
    assert not (tmp_path / "samples.jsonl").exists()
    packed = (tmp_path / PACKED_SEQS).read_bytes()
    assert len(packed) > len(first)
    pack_sequences(tmp_path, progress=False)  # the same sequences give the same bytes
    assert (tmp_path / PACKED_SEQS).read_bytes() == packed


def test_a_bad_sequence_file_or_archive_is_named_and_nothing_is_removed(tmp_path, capsys):
    make_dataset(tmp_path, archs=("a1", "a2"))
    (tmp_path / SEQS / "a2.npz").write_bytes(b"PK\x03\x04 truncated")
    assert main(["dataset", "pack", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]  # after the progress bar
    assert err.startswith("mdot: error: ") and "seqs/a2.npz: not a readable" in err
    assert sorted(p.name for p in (tmp_path / SEQS).iterdir()) == ["a1.npz", "a2.npz"]
    assert not (tmp_path / PACKED_SEQS).exists()
    (tmp_path / SEQS / "a2.npz").unlink()
    (tmp_path / PACKED_SEQS).write_bytes(b"\xfd7zXZ\x00 not really")
    with pytest.raises(DatasetError, match="not a readable sequence archive"):
        _arrays(load_dataset(tmp_path).samples[-1].seq)


def test_a_folder_that_is_no_dataset_says_why(tmp_path, capsys):
    """A missing folder or a file was said to be "not a dataset (no samples.jsonl)"."""
    import re

    (tmp_path / "m.onnx").write_bytes(b"")
    for path, why in ((tmp_path / "none", "no such folder"),
                      (tmp_path / "m.onnx", "a file, not a dataset folder"),
                      (tmp_path, "not a dataset (no samples.jsonl)")):
        said = f"{path}: {why}"
        for read in (load_dataset, check_dataset):
            with pytest.raises(DatasetError, match=f"^{re.escape(said)}$"):
                read(path)
        assert main(["dataset", "info", str(path)]) == 2
        assert capsys.readouterr().err.strip().endswith(said)
