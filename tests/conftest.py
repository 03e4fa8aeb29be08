"""Test set-up: every cache goes to a temporary folder, so tests leave nothing behind."""

import os
import tempfile

_TMP = tempfile.mkdtemp(prefix="mdot-tests-")
for var in ("HOME", "XDG_CACHE_HOME", "TORCH_HOME", "HF_HOME", "MPLCONFIGDIR"):
    os.environ[var] = os.path.join(_TMP, var.lower())
    os.makedirs(os.environ[var], exist_ok=True)
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ.setdefault("JAX_PLATFORMS", "cpu")
