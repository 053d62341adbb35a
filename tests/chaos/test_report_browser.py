"""The report as a reader sees it: one real chaos run on each of the local
and sim backends (latency recorded in µs), the pipeline's fixture runs and
an agreement.json as compare-backends writes it, reported by the pipeline,
then report.html and a run page opened in headless Chromium: at 1400 x 1000
px the first screen holds the answer for every mode, each backend in its
own column; the by-scenario table links to run pages; a run page shows its
timeline and lost message ids; and no table is wider than a 900 px window.

Chromium: Debian's `chromium` (scripts/test installs it where it can); the
browser checks skip, saying so, where none is installed."""

from __future__ import annotations

import json
import os
import re
import shutil
import struct
import subprocess
import sys
from typing import Any

import numpy as np
import pytest
from support.chaos_runs import run_scenario
from support.pipeline_fixtures import fixture_runs, spark  # noqa: F401

from chaos.harness.run_config import Backend
from chaos.report.pipeline import build_report
from chaos.schema import read_jsonl

pytestmark = [pytest.mark.filterwarnings("ignore:PySpark does not yet fully support pandas"),
              # Two real runs, a JVM and a report of 12 runs, on a loaded machine.
              pytest.mark.timeout(900)]

WIDTH, HEIGHT = 1400, 1000  # the first screen
NARROW = 900  # the page must fit a window this wide
CHROMIUM = next((shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome")
                 if shutil.which(n)), None)
needs_chromium = pytest.mark.skipif(
    CHROMIUM is None, reason="no chromium on PATH (Debian: apt-get install chromium; "
                             "scripts/test installs it when run as root)")

# Appended to a copy of a page: measures it once laid out and writes the
# result into the DOM, which --dump-dom prints.
PROBE = """<script>
window.addEventListener('load', () => {
  const tables = [...document.querySelectorAll('table')].map(t => ({
    right: Math.ceil(t.getBoundingClientRect().right), width: t.scrollWidth,
    id: (t.previousElementSibling || {}).id || ''}));
  const imgs = [...document.querySelectorAll('img')].map(i => i.naturalWidth);
  const cells = t => t ? [...t.tBodies[0].rows].map(r => ({
    bottom: r.getBoundingClientRect().bottom,
    cells: [...r.cells].map(c => c.innerText), classes: [...r.cells].map(c => c.className),
    links: [...r.querySelectorAll('a')].map(a => a.getAttribute('href'))})) : [];
  const answer = document.querySelector('table.answer');
  const out = {page: document.documentElement.scrollWidth, tables, imgs,
    height: window.innerHeight,
    h2: [...document.querySelectorAll('h2')].map(h => h.id),
    answer_header: answer ? [...answer.tHead.rows[0].cells].map(c => c.innerText) : [],
    answer: cells(answer), scenarios: cells(document.querySelector('table.scenarios'))};
  const pre = document.createElement('pre');
  pre.id = 'probe';
  pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
});
</script>"""

AGREEMENT = {"agree": True, "failed_runs": 0, "questions": {
    "lost_master": {"question": "which modes lose acknowledged messages from the recovered "
                                "master", "verdict": "agree",
                    "rates": {"ASYNC_MASTER + ASYNC_FLUSH": {"sim": {"k": 0, "n": 1},
                                                             "local": {"k": 0, "n": 1}}}},
    "sync_flush_keeps": {"question": "the SYNC_FLUSH modes lose nothing acknowledged",
                         "verdict": "agree"}}}


@pytest.fixture(scope="module")
def report(spark: Any, tmp_path_factory: pytest.TempPathFactory  # noqa: F811
           ) -> dict[str, Any]:
    root = str(tmp_path_factory.mktemp("browser"))
    runs = os.path.join(root, "runs")
    fixture_runs(os.path.join(runs, "fixtures"))
    real = run_scenario(os.path.join(runs, "real"), "master-crash",
                        "ASYNC_MASTER", "ASYNC_FLUSH", 3)
    sim = run_scenario(os.path.join(runs, "sim"), "master-crash", "ASYNC_MASTER",
                       "ASYNC_FLUSH", 3, backend=Backend.SIM, sim_duration_s=20.0)
    with open(os.path.join(runs, "agreement.json"), "w", encoding="utf-8") as f:
        json.dump(AGREEMENT, f)
    out = os.path.join(root, "report")
    summary = build_report([runs], out)
    return {"out": out, "real": real, "sim": sim, "summary": summary}


def _chromium(page: str, width: int, *args: str) -> subprocess.CompletedProcess[str]:
    assert CHROMIUM is not None
    return subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
         f"--window-size={width},{HEIGHT}", "--virtual-time-budget=5000", *args,
         "file://" + page], capture_output=True, text=True, timeout=120)


def _probe(page: str, width: int = WIDTH) -> dict[str, Any]:
    """Open a copy of `page` with PROBE in Chromium `width` px wide; what it measured."""
    with open(page, encoding="utf-8") as f:
        text = f.read()
    probe_page = page[:-len(".html")] + ".probe.html"
    with open(probe_page, "w", encoding="utf-8") as f:
        f.write(text.replace("</body>", PROBE + "</body>"))
    proc = _chromium(probe_page, width, "--dump-dom")
    found = re.search(r'<pre id="probe">(.*?)</pre>', proc.stdout, re.S)
    assert found, f"no probe result; chromium said: {proc.stderr[-2000:]}"
    return dict(json.loads(found.group(1).replace("&amp;", "&").replace("&lt;", "<")
                           .replace("&gt;", ">").replace("&quot;", '"')))


def test_real_run_latency_is_in_microseconds_end_to_end(report: dict[str, Any]) -> None:
    history = read_jsonl(os.path.join(report["real"], "history.jsonl"))
    assert all(isinstance(h["invoke_us"], int) and isinstance(h["complete_us"], int)
               and h["invoke_us"] // 1000 == h["invoke_ms"] for h in history)
    ok = np.array([h["complete_us"] - h["invoke_us"] for h in history
                   if h["status"] == "PUT_OK"])
    assert (ok % 1000 != 0).any()  # not whole milliseconds
    v = report["summary"].verdicts
    row = v[v["run_dir"] == os.path.abspath(report["real"])].iloc[0]
    # The report's p50 is the µs p50 of the history (to three digits), not
    # a whole number of ms.
    assert row["put_ok_p50_us"] == pytest.approx(float(np.percentile(ok, 50)), rel=0.01)
    assert row["put_ok_p99_us"] == pytest.approx(float(np.percentile(ok, 99)), rel=0.02)


# What every backend's cell of the answer must say, for each mode.
FIRST_SCREEN = {
    "loss rate, k/n and interval": r"^lost: \d+/\d+ runs \(\d+–\d+ %\)",
    "messages per run": r"msgs/run median [\d.]+, max [\d,]+",
    "stranded": r"^stranded: \d+/\d+ runs \(\d+–\d+ %\)",
    "time unwritable": r"^unwritable(/run: median [\d.]+, max [\d.]+ (simulated )?s|: no fault)",
}


@needs_chromium
def test_the_first_screen_answers_per_mode_and_backend(report: dict[str, Any]) -> None:
    """At 1400 x 1000 px, above the fold: for each mode, each backend's loss
    rate with k/n and interval, messages per run, stranded and time
    unwritable, in a column of its own; the agreement beside them."""
    page = os.path.join(report["out"], "report.html")
    got = _probe(page)
    # The answer, the table per scenario, the failover sections when the
    # runs hold failovers (the fixture's isolated-master run), then how to
    # read the report.
    assert got["h2"][:5] == ["the-answer", "by-scenario", "restart-in-place-vs-fail-over",
                             "after-a-failover", "reading-this-report"], got["h2"]
    assert got["answer_header"] == ["mode", "sim", "local", "agreement"]
    assert len(got["answer"]) == 4  # the four modes
    assert 0 < got["height"] <= HEIGHT
    both = 0
    for row in got["answer"]:
        assert row["bottom"] <= got["height"], (row["cells"][0], row["bottom"], got["height"])
        for backend, cell in zip(("sim", "local"), row["cells"][1:3], strict=True):
            if cell == "no runs":
                continue
            for what, pattern in FIRST_SCREEN.items():
                assert re.search(pattern, cell, re.M), (row["cells"][0], backend, what, cell)
            assert ("simulated" in cell) == (backend == "sim") or "no fault" in cell
        both += "no runs" not in row["cells"][1:3]
        assert row["cells"][3].startswith("lost: agree") or "no runs" in row["cells"][1:3]
    assert both == 1  # the real runs' mode ran on both backends
    # The screenshot of that first screen, for a person to look at.
    shot = os.path.join(report["out"], "first-screen.png")
    proc = _chromium(page, WIDTH, f"--screenshot={shot}")
    with open(shot, "rb") as f:
        head = f.read(24)
    assert head[:8] == b"\x89PNG\r\n\x1a\n", proc.stderr[-2000:]
    assert struct.unpack(">II", head[16:24]) == (WIDTH, HEIGHT)


@needs_chromium
def test_the_report_fits_900_px_and_links_its_runs(report: dict[str, Any]) -> None:
    out = report["out"]
    for width in (WIDTH, NARROW):
        got = _probe(os.path.join(out, "report.html"), width)
        assert got["page"] <= width, (width, got["page"])
        assert all(t["right"] <= width for t in got["tables"]), (width, got["tables"])
    assert got["imgs"] and all(w > 0 for w in got["imgs"]), got["imgs"]
    classes = {c for row in got["scenarios"] for c in row["classes"]}
    assert {"violation", "stranded", "ok", "none"} <= classes
    links = [href for row in got["scenarios"] for href in row["links"]]
    assert links
    for href in links:  # each cell links to a run page or the runs' rows
        assert href.startswith("#runs-") or os.path.isfile(
            os.path.join(out, href.replace("%20", " ")))
    page = os.path.join(out, "runs", "loss-async-sync.html")
    got = _probe(page, NARROW)
    assert got["page"] <= NARROW and all(t["right"] <= NARROW for t in got["tables"])


@needs_chromium
def test_a_run_page_shows_its_timeline_and_lost_ids(report: dict[str, Any]) -> None:
    out = report["out"]
    page = os.path.join(out, "runs", "loss-async-sync.html")
    got = _probe(page)
    assert got["imgs"] and all(w > 0 for w in got["imgs"])  # the timeline drew
    assert got["page"] <= WIDTH and all(t["right"] <= WIDTH for t in got["tables"])
    with open(page, encoding="utf-8") as f:
        text = f.read()
    # m4, acknowledged at offset 300, is gone from every node: a violation.
    assert re.search(r"<td>m4</td><td>300</td><td>none</td><td>yes</td><td>no</td>"
                     r"<td>yes</td>", text)
    for href in re.findall(r'href="(\.\./[^"]+)"', text):
        assert os.path.exists(os.path.normpath(os.path.join(out, "runs", href))), href


def test_dlab_report_keeps_the_jvm_quiet(report: dict[str, Any], tmp_path: Any) -> None:
    """A report in its own process (its own JVM, not the tests' session):
    the JVM's start-up notes ("Using incubator modules") and Spark's
    warnings go to spark.log beside the report, not the terminal."""
    out = os.path.join(tmp_path, "out")
    proc = subprocess.run(
        [sys.executable, "-m", "chaos.cli", "report", report["real"], "--out", out],
        capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "incubator" not in proc.stderr and "WARN" not in proc.stderr, proc.stderr
    assert [line for line in proc.stderr.splitlines()
            if not line.startswith("dlab report: [")] == [], proc.stderr
    assert os.path.isfile(os.path.join(out, "spark.log"))
    assert os.path.isfile(os.path.join(out, "report.html"))
