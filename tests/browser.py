"""Polyaxon's UI in headless Chromium (Debian's ``chromium``): render a page, read the runs
table's cells from its DOM."""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile

_CELL = re.compile(
    r'data-gridcell-column-id="([^"]+)"[^>]*data-gridcell-row-index="(\d+)"[^>]*>(.*?)</div>'
)


def chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


def render(url: str, mode: str) -> str:
    """Chromium's output for ``url`` in ``mode`` (``--dump-dom``, ``--screenshot=PATH``)."""
    browser = chromium()
    assert browser, "Debian package chromium is not installed"
    with tempfile.TemporaryDirectory() as profile:
        done = subprocess.run(
            [browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
             "--no-first-run", "--disable-background-networking", "--disable-component-update",
             "--disable-sync", f"--user-data-dir={profile}", "--window-size=1600,1000",
             "--virtual-time-budget=15000", mode, url],
            capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def runs_table(dom: str) -> list[dict[str, str]]:
    """The rows of the UI's runs table, column id -> the cell's text."""
    rows: dict[str, dict[str, str]] = {}
    for column, row, content in _CELL.findall(dom):
        text = re.sub(r"<[^>]+>", " ", content).strip()
        rows.setdefault(row, {})[column] = re.sub(r"\s+", " ", text)
    return list(rows.values())


def readme_on_page(url: str) -> str:
    """A run's overview page as the UI renders it: what it shows of the run's readme (the
    page says "Add a Readme" when the run has none)."""
    dom = render(url, "--dump-dom")
    assert "Add a Readme" not in dom, f"{url} shows no readme"
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", dom))
