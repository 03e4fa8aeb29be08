"""A benchmark script (`benchmarks/NAME.py`) loaded as a module, for the tests of its rules."""

import importlib.util
from pathlib import Path
from types import ModuleType

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def bench(name: str) -> ModuleType:
    """`benchmarks/{name}.py`, executed as the module `name`."""
    spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
