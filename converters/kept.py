"""What is computed from a sequence, kept while the sequence's objects are the same ones."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any


class Kept:
    """The last `size` results of functions of objects, each kept while its key holds the very
    objects it was computed from (a sequence is frozen and its arrays are never written: a
    plan prices one sequence under many layouts). Safe across threads (a service's requests):
    two may compute the same value; the last one is kept."""

    def __init__(self, size: int = 64):
        self.size = size
        self.kept: dict[tuple, tuple[tuple, Any]] = {}  # ids -> (key, value)
        self.lock = threading.Lock()

    def get(self, key: tuple, compute: Callable[[], Any]) -> Any:
        ids = tuple(map(id, key))
        with self.lock:
            hit = self.kept.get(ids)
        if hit is not None and all(a is b for a, b in zip(hit[0], key)):
            return hit[1]
        value = compute()
        with self.lock:
            if len(self.kept) >= self.size:
                self.kept.pop(next(iter(self.kept)))
            self.kept[ids] = (key, value)
        return value

    def each(self, key: tuple, part: Any, compute: Callable[[], Any]) -> Any:
        """`compute()` for `part` (hashable) of what `key` holds (a sequence's blocks, its
        layers), kept with `key`'s other parts."""
        parts = self.get(key, dict)
        if part not in parts:
            parts[part] = compute()
        return parts[part]


KEPT = Kept()
