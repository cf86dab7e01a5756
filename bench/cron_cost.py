"""Microseconds per ``CronSchedule.next_after``, for plain and ``L``/``W``/``#`` expressions.

    python -m bench.cron_cost [--steps 5000] [--repeat 5]

Each measurement walks ``--steps`` consecutive slots (every call asks for the successor of the
previous slot, so the schedule's small memo never answers) from 2026-01-01T00:00Z, in UTC and
in Europe/Berlin, and reports the best of ``--repeat`` walks. An expression the code refuses is
reported as such.
"""

from __future__ import annotations

import argparse
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from slotcron.schedule.slots import CronSchedule

EXPRESSIONS = (
    "*/5 * * * * *",
    "0 0 9 * * MON-FRI",
    "0 0 0 L-3 * *",
    "0 0 0 ? * 5#2",
    "0 */5 * * *",
)
ZONES = ("UTC", "Europe/Berlin")
START = datetime(2026, 1, 1, tzinfo=UTC)


def walk(schedule: CronSchedule, steps: int) -> float:
    """Seconds taken to compute ``steps`` consecutive slots."""
    slot = START
    began = time.perf_counter()
    for _ in range(steps):
        slot = schedule.next_after(slot)
    return time.perf_counter() - began


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=5_000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    print(f"{'expression':<22} {'zone':<14} µs/next_after")
    for expression in EXPRESSIONS:
        for zone in ZONES:
            try:
                schedule = CronSchedule(expression, zone)
            except ValueError as exc:
                print(f"{expression:<22} {zone:<14} refused: {exc}")
                continue
            best = min(walk(schedule, args.steps) for _ in range(args.repeat))
            print(f"{expression:<22} {zone:<14} {best / args.steps * 1e6:8.1f}")


if __name__ == "__main__":
    main()
