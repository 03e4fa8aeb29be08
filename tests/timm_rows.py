"""timm's published RTX 3090 training rows for tests: the rows of a few small architectures,
committed in `data/timm-rows.jsonl` (from `benchmark-train-amp-{nchw,nhwc}-pt112-cu113-
rtx3090.csv`, Ross Wightman, PyTorch Image Models, Apache-2.0)."""

import json
import pathlib

REPO = pathlib.Path(__file__).resolve().parents[1]
ROWS = pathlib.Path(__file__).parent / "data" / "timm-rows.jsonl"
TIMM_HEADER = ("model,train_samples_per_sec,train_step_time,train_batch_size,train_img_size,"
               "param_count")
TINY_ARCHS = ["dla46x_c", "mobilevit_xxs", "dla46_c", "edgenext_xx_small", "mobilevitv2_050",
              "mobilenetv3_small_050", "lcnet_035", "mobilenetv2_035", "lcnet_050",
              "mnasnet_small", "mobilenetv2_050", "ese_vovnet19b_slim_dw"]


def timm_csvs(out: pathlib.Path, names, layouts=("nchw", "nhwc")) -> list[pathlib.Path]:
    """timm's published training-table rows of `names`, written as the builder reads them
    (one CSV per layout, named as published), so the tests need neither `../shared/` nor the
    research data."""
    rows: dict[str, list[str]] = {}
    for line in ROWS.read_text().splitlines():
        r = json.loads(line)
        if r["model"] in names and r["layout"] in layouts:
            rows.setdefault(r["source"], []).append(",".join(
                str(r[k]) for k in TIMM_HEADER.split(",")))
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for source, lines in sorted(rows.items()):
        (out / source).write_text("\n".join([TIMM_HEADER, *lines]) + "\n")
        paths.append(out / source)
    return paths
