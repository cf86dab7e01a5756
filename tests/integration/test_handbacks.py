"""slotcron.engine.handbacks: runs stopped before their body started go back to the queue
together, one write for those stopped in the same turn of the loop (a shutdown under load
stops hundreds at once), and a write that fails hands back nothing and says so. On every
backend."""

from __future__ import annotations

import asyncio
from pathlib import Path

from slotcron.clock import ManualClock
from slotcron.config import Settings
from slotcron.engine.handbacks import HandBacks
from slotcron.store import batch as batch_store
from slotcron.store.database import Database

from tests.conftest import wait_for
from tests.integration.test_batch_claims import SLOT, due, register
from tests.integration.test_starts import EARLY, row_of


async def claim_ahead_many(db: Database, names: list[str], instance: str) -> list[int]:
    decided = await batch_store.claim_many(
        db, [due(n) for n in names], instance_id=instance, now=EARLY
    )
    assert all(not c.started for c in decided.claims.values())
    return [decided.claims[n].execution_id for n in names]


async def test_runs_stopped_together_go_back_in_one_write(db: Database) -> None:
    mine_names = [f"job-{i:02d}" for i in range(40)]
    await register(db, [*mine_names, "theirs"])
    mine = await claim_ahead_many(db, mine_names, "me")
    (theirs,) = await claim_ahead_many(db, ["theirs"], "you")
    handbacks = HandBacks(db, ManualClock(SLOT), "me")

    async with asyncio.timeout(30):
        back = await asyncio.gather(*(handbacks.hand_back(i) for i in [*mine, theirs]))

    assert list(back) == [True] * len(mine) + [False]  # another instance's run is not ours to give
    assert handbacks.writes == 1
    for execution_id in mine:
        row = await row_of(db, execution_id)
        assert (row["status"], row["instance_id"], row["start_key"]) == ("QUEUED", None, None)
    assert (await row_of(db, theirs))["status"] == "RUNNING"


async def test_runs_stopped_while_a_write_is_under_way_go_back_in_the_next(db: Database) -> None:
    names = ["first", "second", "third"]
    await register(db, names)
    first, second, third = await claim_ahead_many(db, names, "me")
    handbacks = HandBacks(db, ManualClock(SLOT), "me")

    async with asyncio.timeout(30):
        one = asyncio.create_task(handbacks.hand_back(first))
        await wait_for(lambda: handbacks.writes == 1, interval=0, what="the first write")
        assert not one.done()  # under way
        later = await asyncio.gather(handbacks.hand_back(second), handbacks.hand_back(third))
        assert await one

    assert list(later) == [True, True]
    assert handbacks.writes == 2
    assert {(await row_of(db, i))["status"] for i in (first, second, third)} == {"QUEUED"}


async def test_a_waiter_cancelled_meanwhile_leaves_the_others_handed_back(db: Database) -> None:
    names = ["cancelled", "kept"]
    await register(db, names)
    cancelled, kept = await claim_ahead_many(db, names, "me")
    handbacks = HandBacks(db, ManualClock(SLOT), "me")

    async with asyncio.timeout(30):
        gone = asyncio.create_task(handbacks.hand_back(cancelled))
        stays = asyncio.create_task(handbacks.hand_back(kept))
        await asyncio.sleep(0)
        gone.cancel()
        assert await stays

    assert gone.cancelled()
    assert handbacks.writes == 1
    # The cancelled waiter's run went back with the write it had joined: nothing ran it.
    assert (await row_of(db, cancelled))["status"] == "QUEUED"


async def test_a_write_that_fails_hands_back_nothing(tmp_path: Path) -> None:
    gone = tmp_path / "gone"
    gone.mkdir()
    url = Settings(database_url=f"sqlite+aiosqlite:///{gone / 'db.sqlite'}").url
    unreachable = Database.connect(url, 1)
    for path in gone.iterdir():
        path.unlink()
    gone.rmdir()  # the file cannot be opened any more
    try:
        handbacks = HandBacks(unreachable, ManualClock(SLOT), "me")
        async with asyncio.timeout(30):
            back = await asyncio.gather(handbacks.hand_back(1), handbacks.hand_back(2))
        assert list(back) == [False, False]
        assert handbacks.writes == 1
    finally:
        await unreachable.close()
