"""slotcron.store.start_keys: the key a chunk claimed ahead waits under fits its column and
names one process's runs of one slot."""

from __future__ import annotations

from datetime import timedelta

from slotcron.store import markers, start_keys
from slotcron.store.database import Database

from tests.store.common import EARLY, NOW, SLOT, markers_of


async def test_a_start_key_is_one_per_instance_slot_and_group_and_fits_its_column(
    db: Database,
) -> None:
    key = start_keys.start_key("me", SLOT)
    assert len(key) == 32 and int(key, 16) >= 0
    assert start_keys.start_key("me", SLOT) == key
    others = {
        start_keys.start_key("Me", SLOT),
        start_keys.start_key("me ", SLOT),
        start_keys.start_key("me", SLOT + timedelta(microseconds=1)),
        start_keys.start_key("me", SLOT, 1),
    }
    assert key not in others and len(others) == 4
    every = sorted({key, *others})
    assert await markers.settle(db, every, now=NOW) == dict.fromkeys(every)
    assert [m[0] for m in await markers_of(db)] == every


async def test_key_for_fills_a_group_up_to_marker_runs_then_takes_the_next(db: Database) -> None:
    instance = f"key-for-{db.dialect.name}"
    first = start_keys.key_for(instance, SLOT, start_keys.MARKER_RUNS - 10, EARLY)
    assert first == start_keys.start_key(instance, SLOT, 0)
    assert start_keys.key_for(instance, SLOT, 10, EARLY) == first, "still within the group"
    second = start_keys.key_for(instance, SLOT, 1, EARLY)
    assert second == start_keys.start_key(instance, SLOT, 1)
    # Once its slot has passed, a slot's groups are forgotten.
    assert start_keys.key_for(instance, SLOT, 1, SLOT) == first
    assert start_keys.key_for(instance, SLOT, 1, SLOT) == first
    await markers.settle(db, [first, second], now=NOW)
    assert {m[0] for m in await markers_of(db)} == {first, second}
