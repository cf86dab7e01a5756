"""Which tests run beside which when the suite runs in several workers (pytest-xdist).

- An ordinary test runs beside any other ordinary test.
- An ``alone`` test (a bound on lateness or lag, a load test, a page in Chromium) runs while no
  ordinary test does. The ``alone`` tests go to one worker together (``--dist loadgroup``) and
  come first; the worker keeps the machine from one to the next, so the others wait once.
- An ``apart`` test (a bound on lateness, but light itself: a few percent of a core, waiting on
  a clock) runs while no ordinary test does, beside the ``alone`` ones: the ``apart`` tests go
  to a second worker together and run during the ``alone`` block instead of after it.

Kept with flock (the kernel lets go of a dead worker's locks), in a folder of the run's own:

- ``shared``: an ordinary test holds it shared; the ``alone`` worker exclusive for its whole
  block. Both take it through ``turnstile``, so that a waiting exclusive is not starved.
- ``block``: the ``alone`` worker holds it exclusive while it holds ``shared`` so: an ``apart``
  test starts only then.
- ``apart``: the ``apart`` worker holds it from its first ``apart`` test to its last; the
  ``alone`` worker takes it before it lets go of ``shared``, so its block outlasts the ``apart``
  tests begun in it. Then it leaves the file ``done``: an ``apart`` test that comes after the
  block takes ``shared`` exclusive itself, as an ``alone`` one would.
"""

from __future__ import annotations

import fcntl
import time
from pathlib import Path
from typing import IO

BESIDE_WAIT = 600.0
"""Seconds an ``apart`` test waits for the ``alone`` block before it takes the machine itself
(the ``alone`` worker died without saying its block was over)."""


class Lanes:
    """One worker's share of the locks; :meth:`enter` before a test, :meth:`leave` after it."""

    def __init__(self, root: Path) -> None:
        root.mkdir(exist_ok=True)
        self.root = root
        self._block: list[IO[str]] = []
        """Held by the ``alone`` worker from its first ``alone`` test to its last: shared, block."""
        self._apart: IO[str] | None = None
        """Held by the ``apart`` worker from its first ``apart`` test to its last."""
        self._own: IO[str] | None = None
        """``shared``, held for the test under way (an ordinary one, or an ``apart`` one that came
        after the block)."""

    def enter(self, kind: str | None) -> None:
        """``kind``: "alone", "apart", or None for an ordinary test."""
        if kind == "alone":
            if not self._block:  # else kept from the previous ``alone`` test
                self._block = [self._take(exclusive=True), self._lock("block")]
            return
        self._end_block()  # the next ``alone`` test went to another worker
        if kind is None:
            self._own = self._take(exclusive=False)
            return
        if self._apart is None:
            self._apart = self._lock("apart")
        deadline = time.monotonic() + BESIDE_WAIT
        while not self._held_elsewhere("block"):
            if (self.root / "done").exists() or time.monotonic() > deadline:
                self._own = self._take(exclusive=True)
                return
            time.sleep(0.05)

    def leave(self, kind: str | None, following: str | None) -> None:
        """After a test of ``kind``; ``following``: the kind of this worker's next test (None
        for an ordinary one, or when there is none)."""
        if self._own is not None:
            self._own.close()  # closing the file lets go of its lock
            self._own = None
        if kind == "alone" and following != "alone":
            self._end_block()
        if kind == "apart" and following != "apart" and self._apart is not None:
            self._apart.close()
            self._apart = None

    def _end_block(self) -> None:
        if not self._block:
            return
        self._lock("apart").close()  # the ``apart`` tests begun in the block end first
        (self.root / "done").touch()
        for held in reversed(self._block):
            held.close()
        self._block = []

    def _take(self, exclusive: bool) -> IO[str]:
        """``shared``, exclusive or not, taken through the turnstile."""
        shared = (self.root / "shared").open("a")
        with (self.root / "turnstile").open("a") as turnstile:
            fcntl.flock(turnstile, fcntl.LOCK_EX)
            fcntl.flock(shared, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        return shared

    def _lock(self, name: str) -> IO[str]:
        held = (self.root / name).open("a")
        fcntl.flock(held, fcntl.LOCK_EX)
        return held

    def _held_elsewhere(self, name: str) -> bool:
        with (self.root / name).open("a") as probe:
            try:
                fcntl.flock(probe, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                return True
            return False
