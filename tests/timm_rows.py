"""timm's published RTX 3090 training rows for tests, recovered from the committed dataset."""

import json
import pathlib

REPO = pathlib.Path(__file__).resolve().parents[1]
TIMM_FUSED = REPO / "data" / "derived" / "timm-rtx3090-fused"
TIMM_HEADER = ("model,train_samples_per_sec,train_step_time,train_batch_size,train_img_size,"
               "param_count")
TINY_ARCHS = ["dla46x_c", "mobilevit_xxs", "dla46_c", "edgenext_xx_small", "mobilevitv2_050",
              "mobilenetv3_small_050", "lcnet_035", "mobilenetv2_035", "lcnet_050",
              "mnasnet_small", "mobilenetv2_050", "ese_vovnet19b_slim_dw"]


def timm_csvs(out: pathlib.Path, names, layouts=("nchw", "nhwc")) -> list[pathlib.Path]:
    """timm's published training-table rows of `names`, written as the builder reads them
    (one CSV per layout, named as published), recovered from the committed dataset
    `data/derived/timm-rtx3090-fused` (its samples keep each row's columns), so the tests
    need no `../shared/` beside the checkout."""
    rows: dict[str, list[str]] = {}
    for line in (TIMM_FUSED / "samples.jsonl").read_text().splitlines():
        s = json.loads(line)
        if s["arch"] in names and s["workload"]["layout"] in layouts:
            m, w = s["meta"], s["workload"]
            rows.setdefault(m["source"], []).append(
                f"{s['arch']},{m['samples_per_sec']},{s['label_ms']},{w['batch_size']},"
                f"{w['input_size']},{m['param_count_m']}")
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for source, lines in sorted(rows.items()):
        (out / source).write_text("\n".join([TIMM_HEADER, *lines]) + "\n")
        paths.append(out / source)
    return paths
