"""The benchmark's jobs (:mod:`bench.jobs`), and a tracemalloc snapshot on SIGUSR2.

Loaded by ``python -X tracemalloc=N -m slotcron run --jobs bench.memory_jobs`` that
``bench/memory.py`` starts: SIGUSR2 writes what is allocated now, by where it was allocated, to
``BENCH_SNAPSHOT``.
"""

from __future__ import annotations

import os
import signal
import tracemalloc
from types import FrameType

import bench.jobs  # noqa: F401 (registers the jobs)


def _dump(signum: int, frame: FrameType | None) -> None:
    if tracemalloc.is_tracing():
        tracemalloc.take_snapshot().dump(os.environ["BENCH_SNAPSHOT"])


signal.signal(signal.SIGUSR2, _dump)
