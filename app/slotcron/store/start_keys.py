"""Start keys: the key a run claimed ahead of its slot waits under, so that one start marker
(:mod:`slotcron.store.markers`) starts a whole burst at its slot."""

from __future__ import annotations

import hashlib
import secrets
from datetime import datetime

_PROCESS = secrets.token_hex(8)
MARKER_RUNS = 100_000
"""Runs claimed ahead for one slot that share a start key, at most (whole chunks); past it the
next key, whose marker goes out at the slot together with the first, on its own connection.
A marker's statement costs the database about 4 us per run it starts (100,000: 0.4-0.6 s at
the slot, before any body starts). Measured on 2 cores, 100,000 due at once: one marker, p99
0.89 s; five of 20,000, 1.15 s on an idle machine (they share its two cores with each other
and with the first bodies' bookkeeping), but 1.7 s against 2.4 s on a machine busy elsewhere."""
_filling: dict[tuple[str, datetime], tuple[int, int]] = {}
"""Per (instance, slot) claimed ahead by this process: the key group being filled, and how many
runs it holds so far."""


def start_key(instance_id: str, slot: datetime, group: int = 0) -> str:
    """The start marker's key of this process's runs claimed ahead of ``slot`` (its
    ``group``-th :data:`MARKER_RUNS`): the same for every chunk of a burst of up to that many
    runs, so one marker starts them all (:mod:`slotcron.store.markers`)."""
    seed = f"{_PROCESS} {instance_id} {slot.isoformat()}"
    if group:
        seed += f" {group}"
    return hashlib.blake2b(seed.encode(), digest_size=16).hexdigest()


def key_for(instance_id: str, slot: datetime, runs: int, now: datetime) -> str:
    """The start key of a chunk of ``runs`` runs claimed ahead of ``slot``: the slot's group
    being filled, or the next one once it holds :data:`MARKER_RUNS`."""
    for gone in [k for k in _filling if k[1] <= now]:
        del _filling[gone]
    group, held = _filling.get((instance_id, slot), (0, 0))
    if held and held + runs > MARKER_RUNS:
        group, held = group + 1, 0
    _filling[instance_id, slot] = (group, held + runs)
    return start_key(instance_id, slot, group)
