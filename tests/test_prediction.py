"""What a `Prediction` says when printed: the numbers a notebook's user reads, in words."""

from mdot_jax.serving.prediction import Prediction


def _p(**fields) -> Prediction:
    base = dict(iteration_ms=1575.4, device="nvidia-h100-sxm", num_ops=9, batch_size=4,
                gpus=8, tokens=2048, mfu=0.412, memory_gb=29.7, memory_limit_gb=80.0,
                phases={"forward": 500.0, "backward": 1075.4}, warnings=["a", "b"])
    return Prediction(**dict(base, **fields))


def test_printing_says_the_step_memory_rates_and_warnings():
    text = str(_p(job_s=7200.0, interval_ms=(1400.0, 1700.0), job_interval_s=(6400.0, 7800.0)))
    assert text.splitlines() == [
        "1,575 ms an iteration (80% band 1,400-1,700 ms) on 8 GPUs of nvidia-h100-sxm",
        "memory 29.7 GB a GPU of 80 GB",
        "20.3 samples/s, 5,200 tokens/s a GPU, MFU 41%",  # 32 samples of 2,048 tokens / 8 GPUs
        "of which forward 500 ms, backward 1,075 ms",
        "the job: 2 h (80% band 1.78-2.17 h), 4,570 iterations of 32 samples, 299M tokens",
        "2 warnings (.warnings)"]


def test_a_step_that_does_not_fit_says_so_and_what_would():
    over = dict(memory_gb=95.0, warnings=[], phases={})
    assert "of 80 GB: does not fit" in str(_p(**over))
    assert "fits.suggest(job, prediction)" in str(_p(**over))  # not asked yet
    assert str(_p(**over, fits_with=[])).endswith("nothing priced fits")
    said = str(_p(**over, fits_with=[{"change": {"batch_size": 2, "grad_accum": 2},
                                      "memory_gb": 60.0, "iteration_ms": 1600.0}]))
    assert said.endswith("fits with batch_size 2, grad_accum 2 (60 GB, 1,600 ms)")
    assert "tight, may not fit" in str(_p(memory_gb=75.0))
    one = str(_p(gpus=1, tokens=0, mfu=None, memory_limit_gb=None, warnings=["w"]))
    assert one.splitlines()[:3] == ["1,575 ms an iteration on nvidia-h100-sxm",
                                    "memory 29.7 GB a GPU", "2.54 samples/s"]
    assert one.endswith("1 warning (.warnings)")


def test_ipython_shows_the_printed_lines_and_repr_keeps_every_field():
    p, shown = _p(), []
    p._repr_pretty_(type("Printer", (), {"text": lambda self, t: shown.append(t)})(), False)
    assert shown == [str(p)] and repr(p).startswith("Prediction(iteration_ms=1575.4, ")
