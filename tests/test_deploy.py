"""The ready-made Prometheus rules and Grafana dashboard in deploy/: valid, and over metrics
that exist.

``promtool`` (Debian package ``prometheus``) checks the rules and runs their unit tests when it
is installed; without it those tests are skipped with a plain reason, except under
``CI=true``, where ``.ci/run`` installs it and a missing one is a failure.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import aiohttp
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families
from slotcron.jobs.registry import Registry, every

from tests.conftest import CI, ServiceFactory, wait_for

ROOT = Path(__file__).resolve().parents[1]
RULES = ROOT / "deploy" / "prometheus-rules.yaml"
RULES_TESTS = ROOT / "deploy" / "prometheus-rules.test.yaml"
DASHBOARD = ROOT / "deploy" / "grafana-dashboard.json"

_METRIC = re.compile(r"\bslotcron_[a-z0-9_]+\b")
_SUFFIXES = ("_bucket", "_count", "_sum", "_total", "_created")


def promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        if CI:
            pytest.fail("CI=true and promtool is missing (.ci/run installs Debian's prometheus)")
        pytest.skip("promtool not installed (Debian: apt-get install prometheus)")
    return path


def rule_expressions() -> list[str]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return [rule["expr"] for group in groups for rule in group["rules"]]


def dashboard_expressions() -> list[str]:
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for panel in dashboard["panels"] for t in panel.get("targets", [])]
    for variable in dashboard["templating"]["list"]:
        query = variable.get("query")
        if isinstance(query, dict):
            exprs.append(query["query"])
    return exprs


def base_name(name: str) -> str:
    for suffix in _SUFFIXES:
        if name.endswith(suffix):
            return name.removesuffix(suffix)
    return name


def declared_in_source() -> set[str]:
    """Metric names app/slotcron/observe/metrics.py declares (prometheus-client adds ``_total`` to
    counters)."""
    source = (ROOT / "app" / "slotcron" / "observe" / "metrics.py").read_text()
    return {base_name(name) for name in re.findall(r'"(slotcron_[a-z0-9_]+)"', source)}


def test_the_rules_pass_promtool_check() -> None:
    result = subprocess.run(
        [promtool(), "check", "rules", str(RULES)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_the_rules_fire_on_the_series_they_watch() -> None:
    """promtool's rule unit tests: each alert fires on a series that should raise it, and the
    leader and lag alerts stay quiet on a healthy cluster."""
    result = subprocess.run(
        [promtool(), "test", "rules", str(RULES_TESTS)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=RULES_TESTS.parent,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_dashboard_is_grafana_json_with_a_query_on_every_panel() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["uid"] == "slotcron"
    ids = [panel["id"] for panel in dashboard["panels"]]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    for panel in dashboard["panels"]:
        assert panel.get("targets"), f"panel {panel['title']!r} queries nothing"
        assert all(t["expr"].strip() for t in panel["targets"]), panel["title"]


def scrape_jobs() -> Registry:
    registry = Registry()

    @every(seconds=1, name="deploy.ok", registry=registry)
    async def ok() -> None:
        pass

    @every(seconds=1, name="deploy.broken", registry=registry)
    async def broken() -> None:
        raise RuntimeError("broken on purpose")

    return registry


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
async def test_every_metric_the_rules_and_dashboard_use_exists(
    start_service: ServiceFactory,
) -> None:
    """A typo in a metric name would make an alert that can never fire and a panel that stays
    empty, silently: each name must be served by a live /metrics or declared in
    app/slotcron/observe/metrics.py."""
    service = await start_service(list(scrape_jobs()), http_port=0)
    assert service.http is not None
    url = f"{service.http.url}/metrics"

    async def scraped() -> set[str] | None:
        async with aiohttp.ClientSession() as client, client.get(url) as response:
            text = await response.text()
        names = {
            sample.name
            for family in text_string_to_metric_families(text)
            for sample in family.samples
        }
        return names if "slotcron_run_duration_seconds_bucket" in names else None

    live: set[str] = await wait_for(scraped, timeout=15, interval=0.3, what="a run to be counted")
    # The exact names a declared metric may be asked for by (a labelled counter or histogram
    # is served only once something was counted under its labels).
    forms = ("", "_total", "_bucket", "_count", "_sum")
    known = live | {base + form for base in declared_in_source() for form in forms}
    used: dict[str, str] = {}
    for where, exprs in (("rules", rule_expressions()), ("dashboard", dashboard_expressions())):
        for expr in exprs:
            for name in _METRIC.findall(expr):
                used.setdefault(name, where)
    assert "slotcron_slots_total" in used and "slotcron_fire_lag_seconds_bucket" in used
    unknown = {name: where for name, where in used.items() if name not in known}
    assert not unknown, f"metrics used but served by no instance: {unknown}"
