"""The dashboard with a read token (issue 26, item 10), in headless Chromium: the page reads with
the token it is given; a write refused to it asks for an admin token and keeps the read token
(the page goes on showing data) when the person cancels; given the admin token, the write is
done."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from slotcron.store.database import Database

from tests.conftest import wait_for
from tests.http.browser import chromium
from tests.http.conftest import TOKEN, base_url
from tests.http.test_dashboard import (
    _paused,
    chromium_path,  # noqa: F401 (a fixture)
    dashboard_jobs,
    give_token,
    row,
)

READER = "read-only-token-5d21e8"


def why_says(pattern: str) -> str:
    return (
        "(() => { const form = document.getElementById('token-form');"
        " const why = document.getElementById('token-why').textContent;"
        f" return !form.hidden && /{pattern}/.test(why) && why; }})()"
    )


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
async def test_the_dashboard_reads_with_a_read_token_and_asks_an_admin_token_for_a_write(
    chromium_path: str,  # noqa: F811
    db: Database,
    serve: Any,
    tmp_path: Path,
) -> None:
    service = await serve(list(dashboard_jobs()), admin_token=TOKEN, read_token=READER)
    url = base_url(service)
    profile = tmp_path / "chromium"
    profile.mkdir()
    async with chromium(chromium_path, profile) as page:
        await page.goto(f"{url}/")
        await give_token(page, READER)
        listed = f"document.querySelector({json.dumps(row('browser.tick'))}) !== null"
        await page.wait_for(listed, what="the jobs, read with the read token")
        await page.wait_for(
            "document.querySelector('#executions tr[data-status=\"COMPLETED\"]') !== null",
            what="the executions, read with the read token",
        )

        # A write with the read token: refused, and the page asks for an admin token.
        await page.click(f'{row("browser.tick")} button[data-action="pause"]')
        await page.wait_for(why_says("may only read"), what="an admin token to be asked")
        assert await page.evaluate(f"sessionStorage.getItem('slotcron.token') === '{READER}'")
        await page.click("#token-cancel")
        # Still reading with the read token: the listing refreshes, nothing is asked again.
        updated = await page.evaluate("document.getElementById('updated').textContent")
        await page.wait_for(
            f"document.getElementById('updated').textContent !== {json.dumps(updated)}",
            what="a refresh after the cancelled write",
        )
        assert await page.evaluate("document.getElementById('token-form').hidden")
        assert not await _paused(db, "browser.tick")

        # The same write with the admin token given when asked: done.
        await page.click(f'{row("browser.tick")} button[data-action="pause"]')
        await page.wait_for(why_says("may only read"), what="an admin token to be asked again")
        await page.click("#token-input")
        await page.type(TOKEN)
        await page.click("#token-save")
        await page.wait_for(
            f"document.querySelector({json.dumps(row('browser.tick') + ' td.paused')}) !== null",
            what="the job to show paused",
        )
        await wait_for(lambda: _paused(db, "browser.tick"), what="the job paused in the database")
