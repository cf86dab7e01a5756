"""The garbage collector's long passes in the test process, noted with the test they fell in.

In-process instances share the test process's loop: a full collection over everything a long
session keeps alive (reports, captured logs, modules) stops that loop as a blocked job would,
and a one-second slot reached more than its grace late is recorded ``MISSED``. The service
itself freezes what start-up made (:func:`slotcron.service.service.tune_gc`); an embedded
scheduler leaves the host's collector alone, so the suite does what a host would: it freezes
what earlier tests left alive (:func:`settle`) and says, at the end, which passes still took
long (:func:`long_passes`).
"""

from __future__ import annotations

import gc
import os
import time
from typing import Any

LONG = 0.1
"""A pass at least this long (seconds) is noted."""

_LOG = os.environ.get("SLOTCRON_TEST_GC_LOG")
"""A file each long pass is written to as it happens (for a run watched while it goes)."""
_started = 0.0
_test = ""
_long: list[tuple[float, int, str]] = []


def _callback(phase: str, info: dict[str, Any]) -> None:
    global _started
    if phase == "start":
        _started = time.perf_counter()
        return
    took = time.perf_counter() - _started
    if took >= LONG and _test:
        _long.append((took, int(info.get("generation", -1)), _test))
        if _LOG:
            with open(_LOG, "a") as log:
                log.write(
                    f"{took * 1000:.0f} ms gen {info.get('generation')} "
                    f"tracked {len(gc.get_objects())}: {_test}\n"
                )


def install() -> None:
    if _callback not in gc.callbacks:
        gc.callbacks.append(_callback)


def entering(test: str) -> None:
    global _test
    _test = test


def settle() -> None:
    """Between tests: collect what the last test left, then freeze what survives, so that no
    later pass walks the session's accumulated objects again."""
    global _test
    _test = ""
    gc.collect()
    gc.freeze()


def long_passes() -> list[str]:
    return [
        f"{took * 1000:.0f} ms, generation {generation}: {test}"
        for took, generation, test in sorted(_long, reverse=True)
    ]
