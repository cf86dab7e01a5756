from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.cluster.harness import Instance

Spawn = Callable[..., Instance]


@pytest.fixture
def spawn(db_url: str, tmp_path: Path) -> Iterator[Spawn]:
    """Start real ``slotcron run`` processes on the test's database; killed at teardown."""
    started: list[Instance] = []

    def start(name: str, jobs: str, **env: Any) -> Instance:
        instance = Instance(
            name=name,
            db_url=db_url,
            jobs=jobs,
            record_path=tmp_path / "records.jsonl",
            log_path=tmp_path / f"{name}.log",
            env={k: str(v) for k, v in env.items()},
        ).start()
        started.append(instance)
        return instance

    yield start
    for instance in started:
        instance.kill()


@pytest.fixture
def records_path(tmp_path: Path) -> Path:
    return tmp_path / "records.jsonl"
