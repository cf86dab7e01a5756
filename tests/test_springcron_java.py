"""Side by side with the real thing: our six-field slots against Java cron implementations.

Debian ships Spring 4.3 (``libspring-context-java``: ``CronSequenceGenerator``, the predecessor
of 5.3's ``CronExpression`` with the same both-day-fields rule) and Quartz 2.3
(``libquartz2-java``: ``CronExpression``, whose ``L``, ``L-n``, ``LW``, ``nW``, ``dL`` and
``d#n`` mean what Spring 5.3's mean). Plain expressions are compared with Spring 4.3, the
``L``/``W``/``#`` forms with Quartz, in UTC (the zones' DST rules are the contract's, not
Java's). The corpus avoids what those older versions read differently from Spring 5.3: ``*/n``
in a day field (4.3 counts it from 0) and ``nW`` near a month's end (Quartz moves a Sunday
that ends the month back to Friday; Spring 5.3 does not), and a start whose second 4.3 would
carry over (see ``SPRING_STARTS``). Skipped, saying why, without java
or the jars:

    apt-get install libspring-context-java libquartz2-java default-jdk-headless
"""

from __future__ import annotations

import random
import shutil
import subprocess
from datetime import UTC, datetime
from pathlib import Path

import pytest
from slotcron.schedule.springcron import SpringCron

JARS = [
    Path("/usr/share/java/spring3-context.jar"),
    Path("/usr/share/java/spring3-core.jar"),
    Path("/usr/share/java/quartz2.jar"),
]
STARTS = [datetime(2026, 1, 1), datetime(2027, 6, 15, 13, 7, 41), datetime(2028, 2, 28, 23, 59)]
# Spring 4.3 keeps the second it found when a larger field then moves (from 13:07:41, '*/9 0
# 5/3 * * *' gives 14:00:45, not 14:00:00; fixed in 5.x): from a 59th second the second it finds
# is either 59 itself or, wrapping, the field's first, which is what a reset gives.
SPRING_STARTS = [datetime(2025, 12, 31, 23, 59, 59), datetime(2027, 6, 15, 13, 7, 59)]
COUNT = 5

ORACLE = """
import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.util.Date;
import java.util.TimeZone;

public class CronOracle {
    public static void main(String[] args) throws Exception {
        TimeZone utc = TimeZone.getTimeZone("UTC");
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in));
        String line;
        while ((line = in.readLine()) != null) {
            String[] parts = line.split("\\t");
            Date moment = new Date(Long.parseLong(parts[1]) * 1000L);
            int count = Integer.parseInt(parts[2]);
            StringBuilder out = new StringBuilder();
            try {
                if (parts[0].equals("spring")) {
                    org.springframework.scheduling.support.CronSequenceGenerator spring =
                        new org.springframework.scheduling.support.CronSequenceGenerator(
                            parts[3], utc);
                    for (int i = 0; i < count; i++) {
                        moment = spring.next(moment);
                        out.append(moment.getTime() / 1000L).append(' ');
                    }
                } else {
                    org.quartz.CronExpression quartz = new org.quartz.CronExpression(parts[3]);
                    quartz.setTimeZone(utc);
                    for (int i = 0; i < count && moment != null; i++) {
                        moment = quartz.getNextValidTimeAfter(moment);
                        out.append(moment == null ? "none" : moment.getTime() / 1000L).append(' ');
                    }
                }
                System.out.println(out.toString().trim());
            } catch (Exception e) {
                System.out.println("ERR " + e.getClass().getSimpleName() + ": " + e.getMessage());
            }
        }
    }
}
"""


def _java_or_skip() -> str:
    java = shutil.which("java")
    if java is None:
        pytest.skip("no java on PATH (apt-get install default-jdk-headless)")
    missing = [str(jar) for jar in JARS if not jar.exists()]
    if missing:
        pytest.skip(f"missing {', '.join(missing)} (libspring-context-java, libquartz2-java)")
    modules = subprocess.run(
        [java, "--list-modules"], capture_output=True, text=True, timeout=60, check=False
    )
    if "jdk.compiler" not in modules.stdout:
        pytest.skip("this java cannot run a source file (a JRE without jdk.compiler)")
    return java


def _plain_field(rng: random.Random, low: int, high: int, stars: bool) -> str:
    kind = rng.choice(["*", "n", "list", "range", "n/step", "range/step"] + ["*/step"] * stars)
    a, b = sorted(rng.sample(range(low, high + 1), 2))
    return {
        "*": "*",
        "n": str(a),
        "list": ",".join(str(v) for v in sorted(rng.sample(range(low, high + 1), 3))),
        "range": f"{a}-{b}",
        "n/step": f"{a}/{rng.randint(1, 9)}",
        "range/step": f"{a}-{b}/{rng.randint(1, 4)}",
        "*/step": f"*/{rng.randint(1, 9)}",
    }[kind]


def _times(rng: random.Random) -> str:
    second = rng.choice(["0", "0", _plain_field(rng, 0, 59, True)])
    minute = rng.choice(["0", _plain_field(rng, 0, 59, True)])
    return f"{second} {minute} {_plain_field(rng, 0, 23, True)}"


def _months(rng: random.Random) -> str:
    return rng.choice(["*", "*", _plain_field(rng, 1, 12, True), "JAN,APR,JUL,OCT", "MAR-NOV"])


def plain_corpus(rng: random.Random, size: int) -> list[str]:
    """Both day fields often restricted; names, ranges, steps, lists; no '*/n' in a day field."""
    corpus = []
    for _ in range(size):
        month_day = rng.choice(["*", "?", _plain_field(rng, 1, 31, False), "1-7", "13"])
        week_day = rng.choice(
            ["*", "?", _plain_field(rng, 0, 6, False), "MON-FRI", "SUN", "7", "FRI", "SAT,SUN"]
        )
        corpus.append(f"{_times(rng)} {month_day} {_months(rng)} {week_day}")
    return corpus


def quartz_corpus(rng: random.Random, size: int) -> list[str]:
    """One L, W or # form in a day field, '?' in the other (as Quartz requires)."""
    names = ["MON", "TUE", "WED", "THU", "FRI", "SAT", "SUN"]
    corpus = []
    for _ in range(size):
        if rng.random() < 0.5:
            month_day = rng.choice(["L", "LW", f"L-{rng.randint(1, 27)}", f"{rng.randint(1, 27)}W"])
            week_day = "?"
        else:
            month_day = "?"
            name = rng.choice(names)
            week_day = rng.choice([f"{name}L", f"{name}#{rng.randint(1, 5)}"])
        corpus.append(f"{_times(rng)} {month_day} {_months(rng)} {week_day}")
    return corpus


def ours(expression: str, start: datetime) -> str:
    cron = SpringCron.parse(expression)
    slots, wall = [], start
    for _ in range(COUNT):
        found = cron.next_wall(wall)
        assert found is not None
        slots.append(str(int(found.replace(tzinfo=UTC).timestamp())))
        wall = found
    return " ".join(slots)


def test_our_six_field_slots_are_the_ones_spring_and_quartz_compute(tmp_path: Path) -> None:
    java = _java_or_skip()
    rng = random.Random(14)
    cases = [("spring", e) for e in plain_corpus(rng, 150)]
    cases += [("quartz", e) for e in quartz_corpus(rng, 150)]
    lines = [
        f"{engine}\t{int(start.replace(tzinfo=UTC).timestamp())}\t{COUNT}\t{expression}"
        for engine, expression in cases
        for start in (SPRING_STARTS if engine == "spring" else STARTS)
    ]
    source = tmp_path / "CronOracle.java"
    source.write_text(ORACLE, encoding="utf-8")
    done = subprocess.run(
        [java, "-cp", ":".join(map(str, JARS)), str(source)],
        input="\n".join(lines) + "\n",
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    answers = done.stdout.splitlines()
    assert len(answers) == len(lines), done.stderr

    compared, differences, refused = 0, [], []
    for line, answer in zip(lines, answers, strict=True):
        engine, start, _, expression = line.split("\t")
        if answer.startswith("ERR"):
            refused.append(f"{engine}: {expression!r}: {answer}")  # e.g. 4.3's 366-day search
            continue
        mine = ours(expression, datetime.fromtimestamp(int(start), UTC).replace(tzinfo=None))
        compared += 1
        if mine != answer:
            differences.append(f"{engine} {expression!r} after {start}: ours {mine}, {answer}")
    assert not differences, "\n".join(differences)
    assert compared >= 0.9 * len(lines), "\n".join(refused)
    print(f"{compared} cases agree, {len(refused)} refused by Java")
