"""The suite's lanes (tests/lanes.py) between real processes: an ``apart`` test runs beside the
``alone`` block and never beside an ordinary test; the block lasts until the ``apart`` tests
begun in it end; an ``apart`` test after the block takes the machine itself."""

from __future__ import annotations

import multiprocessing
import time
from collections.abc import Callable, Iterator
from multiprocessing.synchronize import Event
from pathlib import Path

import pytest

from tests.lanes import Lanes

FORK = multiprocessing.get_context("fork")
WAIT = 10.0


def _worker(root: Path, kind: str | None, entered: Event, leave: Event, left: Event) -> None:
    lanes = Lanes(root)
    lanes.enter(kind)
    entered.set()
    leave.wait(WAIT)
    lanes.leave(kind, None)
    left.set()


class Worker:
    """A test of ``kind`` in a process of its own: it enters, and leaves when told."""

    def __init__(self, root: Path, kind: str | None) -> None:
        self.entered, self.go, self.left = FORK.Event(), FORK.Event(), FORK.Event()
        self.process = FORK.Process(
            target=_worker, args=(root, kind, self.entered, self.go, self.left), daemon=True
        )
        self.process.start()

    def leave(self) -> None:
        self.go.set()


Start = Callable[[str | None], Worker]


@pytest.fixture
def start(tmp_path: Path) -> Iterator[Start]:
    started: list[Worker] = []

    def make(kind: str | None) -> Worker:
        worker = Worker(tmp_path, kind)
        started.append(worker)
        return worker

    yield make
    for worker in started:
        worker.process.kill()
        worker.process.join(5)


def test_an_apart_test_runs_beside_the_alone_block_and_no_ordinary_test_does(start: Start) -> None:
    alone = start("alone")
    assert alone.entered.wait(WAIT)
    apart = start("apart")
    assert apart.entered.wait(WAIT), "the apart test did not run beside the alone block"
    ordinary = start(None)
    assert not ordinary.entered.wait(0.5), "an ordinary test ran beside the alone block"
    alone.leave()
    # The block outlasts the apart test begun in it: still no ordinary test.
    assert not alone.left.wait(0.5), "the alone block ended under a running apart test"
    assert not ordinary.entered.is_set()
    apart.leave()
    assert alone.left.wait(WAIT) and ordinary.entered.wait(WAIT)
    assert apart.left.wait(WAIT)  # it lets go of its lock a moment before it says so


def test_an_apart_test_after_the_block_takes_the_machine_itself(start: Start) -> None:
    alone = start("alone")
    assert alone.entered.wait(WAIT)
    alone.leave()
    assert alone.left.wait(WAIT)
    ordinary = start(None)
    assert ordinary.entered.wait(WAIT)
    apart = start("apart")
    assert not apart.entered.wait(0.5), "an apart test ran beside an ordinary one"
    ordinary.leave()
    assert apart.entered.wait(WAIT)
    late = start(None)
    assert not late.entered.wait(0.5), "an ordinary test ran beside an apart one"
    apart.leave()
    assert late.entered.wait(WAIT)


def test_an_apart_test_waits_for_the_block_while_ordinary_tests_run(start: Start) -> None:
    ordinary = start(None)
    assert ordinary.entered.wait(WAIT)
    alone = start("alone")
    apart = start("apart")
    time.sleep(0.3)
    assert not alone.entered.is_set() and not apart.entered.is_set()
    ordinary.leave()
    assert alone.entered.wait(WAIT) and apart.entered.wait(WAIT)
