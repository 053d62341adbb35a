"""The report as a reader sees it: one real chaos run (latency recorded in
µs) and the pipeline's fixture runs, reported by the pipeline, then
report.html and a run page opened in headless Chromium at 1400 px: the loss
grid comes first and links to run pages, a run page shows its timeline and
lost message ids, and no table is wider than the window.

Chromium: Debian's `chromium` (scripts/test installs it where it can); the
browser checks skip, saying so, where none is installed."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from typing import Any

import numpy as np
import pytest
from support.chaos_runs import run_scenario
from support.pipeline_fixtures import fixture_runs, spark  # noqa: F401

from chaos.report.pipeline import build_report
from chaos.schema import read_jsonl

pytestmark = pytest.mark.filterwarnings("ignore:PySpark does not yet fully support pandas")

WIDTH = 1400
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
  const grid = document.querySelector('#loss-grid ~ table');
  const out = {page: document.documentElement.scrollWidth, tables, imgs,
    h2: [...document.querySelectorAll('h2')].map(h => h.id),
    grid_rows: grid ? grid.tBodies[0].rows.length : 0,
    grid_classes: grid ? [...grid.querySelectorAll('td[class]')].map(td => td.className) : [],
    grid_links: grid ? [...grid.querySelectorAll('a')].map(a => a.getAttribute('href')) : []};
  const pre = document.createElement('pre');
  pre.id = 'probe';
  pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
});
</script>"""


@pytest.fixture(scope="module")
def report(spark: Any, tmp_path_factory: pytest.TempPathFactory  # noqa: F811
           ) -> dict[str, Any]:
    root = str(tmp_path_factory.mktemp("browser"))
    runs = os.path.join(root, "runs")
    fixture_runs(os.path.join(runs, "fixtures"))
    real = run_scenario(os.path.join(runs, "real"), "master-crash",
                     "ASYNC_MASTER", "ASYNC_FLUSH", 3)
    out = os.path.join(root, "report")
    summary = build_report([runs], out)
    return {"out": out, "real": real, "summary": summary}


def _probe(page: str) -> dict[str, Any]:
    """Open a copy of `page` with PROBE in Chromium at WIDTH px; what it measured."""
    with open(page, encoding="utf-8") as f:
        text = f.read()
    probe_page = page[:-len(".html")] + ".probe.html"
    with open(probe_page, "w", encoding="utf-8") as f:
        f.write(text.replace("</body>", PROBE + "</body>"))
    assert CHROMIUM is not None
    proc = subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
         f"--window-size={WIDTH},1000", "--virtual-time-budget=5000", "--dump-dom",
         "file://" + probe_page], capture_output=True, text=True, timeout=120)
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


@needs_chromium
def test_report_opens_with_the_loss_grid_and_no_table_overflows(report: dict[str, Any]
                                                                ) -> None:
    out = report["out"]
    got = _probe(os.path.join(out, "report.html"))
    assert got["h2"][:3] == ["reading-this-report", "loss-grid", "what-a-put-ok-promises"]
    assert got["grid_rows"] == 4  # the four modes
    assert {"violation", "stranded", "ok"} <= set(got["grid_classes"])
    for href in got["grid_links"]:  # each cell links to a run page or the runs' rows
        assert href.startswith("#runs-") or os.path.isfile(
            os.path.join(out, href.replace("%20", " ")))
    assert got["page"] <= WIDTH, got
    assert all(t["right"] <= WIDTH for t in got["tables"]), got["tables"]
    assert got["imgs"] and all(w > 0 for w in got["imgs"]), got["imgs"]


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
