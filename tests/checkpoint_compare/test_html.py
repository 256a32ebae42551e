"""The HTML report opens in headless Chromium and its plots are real images."""

from __future__ import annotations

import base64
import io
import re
import shutil
import subprocess
from pathlib import Path

import matplotlib.image
import pytest
from click.testing import CliRunner

from checkpoint_compare.cli import main
from tests.checkpoint_compare.recorded import write_fio_run, write_hook_run, write_repeats

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
PLOTS = ("plot-samples", "plot-stages", "plot-pause", "plot-fio")  # every workload has plot-samples
# Written into a copy of the report: the browser reports what it decoded of each image.
PROBE = """<script>
for (const img of document.images) {
  const p = document.createElement('p');
  p.className = 'probe';
  p.textContent = img.id + ' ' + img.complete + ' ' + img.naturalWidth + 'x' + img.naturalHeight;
  document.body.appendChild(p);
}
for (const svg of document.querySelectorAll('#plot-intervals svg')) {
  const box = svg.getBoundingClientRect();
  const p = document.createElement('p');
  p.className = 'svg-probe';
  p.textContent = Math.round(box.width) + 'x' + Math.round(box.height) + ' '
    + svg.querySelectorAll('g.interval circle').length;
  document.body.appendChild(p);
}
for (const id of ['verdict', 'recommendation', 'plot-intervals', 'plot-pause', 'plot-stages']) {
  const box = document.getElementById(id).getBoundingClientRect();
  const p = document.createElement('p');
  p.className = 'place-probe';
  p.textContent = id + ' ' + Math.round(box.top) + ' ' + Math.round(box.height);
  document.body.appendChild(p);
}
</script>"""


def _chromium(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    profile = tmp_path / "chromium-profile"
    profile.mkdir(exist_ok=True)
    return subprocess.run(
        [
            CHROMIUM,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            f"--user-data-dir={profile}",
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=90,
        check=True,
    )


@pytest.fixture
def report_html(runs_root: Path, tmp_path: Path) -> Path:
    for profile, pauses, runtime, bw in (
        ("checkpoint-baseline", [2.0, 2.1, 1.9] * 2, 100.0, 125),
        ("checkpoint-throughput", [1.0, 1.1, 0.9] * 2, 90.0, 250),
    ):
        write_hook_run(profile)
        write_fio_run(bw_mbps=bw, lat_p99_us=500_000 / bw)
        write_repeats(profile, pauses, runtime_s=runtime)
    html = tmp_path / "out" / "report.html"
    result = CliRunner().invoke(
        main, ["--offline-root", str(runs_root), "--html", str(html), "--no-track"]
    )
    assert result.exit_code == 0, result.output
    return html


def test_plots_are_embedded_pngs(report_html: Path) -> None:
    text = report_html.read_text()
    assert "http://" not in text and "https://" not in text  # self-contained
    for plot_id in PLOTS:
        match = re.search(rf"id='{plot_id}'[^>]*src='data:image/png;base64,([^']+)'", text)
        assert match, plot_id
        data = base64.b64decode(match[1])
        assert data.startswith(b"\x89PNG\r\n\x1a\n")
        pixels = matplotlib.image.imread(io.BytesIO(data), format="png")
        height, width = pixels.shape[:2]
        assert width > 300 and height > 200
        assert pixels.std() > 0.01  # not a blank canvas


@pytest.mark.integration
@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed")
def test_report_opens_in_headless_chromium(report_html: Path, tmp_path: Path) -> None:
    probe = tmp_path / "probe.html"
    probe.write_text(report_html.read_text().replace("</body>", PROBE + "</body>"))
    dom = _chromium(tmp_path, "--virtual-time-budget=5000", "--dump-dom", probe.as_uri()).stdout
    assert "Verdict: checkpoint-throughput" in dom
    decoded = dict(
        (m[1], (m[2], int(m[3]), int(m[4])))
        for m in re.finditer(r"<p class=\"probe\">(\S+) (\w+) (\d+)x(\d+)</p>", dom)
    )
    assert set(decoded) == set(PLOTS), dom[-2000:]
    for plot_id, (complete, width, height) in decoded.items():
        assert complete == "true" and width > 300 and height > 200, plot_id

    # The intervals are drawn: two panels (pause, whole run), one candidate each.
    drawn = re.findall(r"<p class=\"svg-probe\">(\d+)x(\d+) (\d+)</p>", dom)
    assert len(drawn) == 2 and all(int(w) > 300 and int(n) == 1 for w, _, n in drawn), drawn

    # The first screen (900 px) says what to do and shows why: the verdict, the
    # recommendation and the intervals' first panel lie in it; the plots follow.
    placed = {
        m[1]: (int(m[2]), int(m[3]))
        for m in re.finditer(r"<p class=\"place-probe\">(\S+) (-?\d+) (\d+)</p>", dom)
    }
    assert placed["verdict"][0] < placed["recommendation"][0] < placed["plot-intervals"][0]
    assert placed["plot-intervals"][0] + 150 < 900, placed
    assert placed["plot-intervals"][0] < placed["plot-pause"][0] < placed["plot-stages"][0]

    shot = tmp_path / "shot.png"
    _chromium(tmp_path, "--window-size=1200,900", f"--screenshot={shot}", report_html.as_uri())
    pixels = matplotlib.image.imread(shot)
    assert pixels.shape[:2] == (900, 1200)
    # Not a blank page: text, the verdict's box and the intervals' drawing make it vary.
    assert pixels[..., :3].std() > 0.05
    assert (pixels[..., :3] < 0.5).mean() > 0.005  # dark ink: text and lines
