"""The web dashboard's screenshots in docs/: a supervisor with some work, in headless Chromium.

    .venv/bin/python scripts/screenshots.py [--out docs]

Starts a supervisor (embedded PostgreSQL in a temporary state_dir) with two groups, submits
jobs (some running with progress, some failing for good), spreads the finished ones' times
over the last hour so that the chart has a history to show, and saves
dashboard-overview.png, dashboard-dead-letters.png and dashboard-job.png. Needs Debian's
`chromium` (make test installs it) and playwright (the test extra).
"""

from __future__ import annotations

import argparse
import shutil
import socket
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench_ondemand import start_supervisor  # noqa: E402

from fairsched.store.queue import Queue  # noqa: E402

HANDLERS = '''
import time

import fairsched


def render(job):
    seconds = float(job.payload.get("seconds", 60))
    started = time.monotonic()
    while time.monotonic() - started < seconds:
        done = (time.monotonic() - started) / seconds
        job.progress(done, f"page {int(done * 40) + 1} of 40")
        if job.cancelled():
            return None
        time.sleep(0.5)
    return {"pages": 40}


def ingest(job):
    if job.payload.get("broken"):
        raise ValueError(f"row {job.payload['row']}: {job.payload['broken']!r} is not a date "
                         "(expected YYYY-MM-DD)")
    return {"rows": job.payload.get("rows", 0)}
'''

WORKERS = """
[[worker]]
name = "pdf"
handler = "demo_handlers:render"
types = ["pdf.render"]
processes = 2
slots = 2

[[worker]]
name = "etl"
handler = "demo_handlers:ingest"
types = ["csv.ingest", "xlsx.ingest"]
max_attempts = 1
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(ROOT / "docs"))
    args = parser.parse_args()
    from playwright.sync_api import sync_playwright

    folder = Path(tempfile.mkdtemp(prefix="fss-", dir="/tmp"))
    port = free_port()
    (folder / "demo_handlers.py").write_text(HANDLERS)
    proc, _ = start_supervisor(folder, f'web = "127.0.0.1:{port}"\n' + WORKERS)
    config = folder / "workers.toml"
    try:
        with Queue.open(config) as queue:
            ids = [queue.enqueue("csv.ingest", {"file": f"orders-{i}.csv", "rows": 1000 + i})
                   for i in range(40)]
            ids += [queue.enqueue("xlsx.ingest", {"file": f"stock-{i}.xlsx", "rows": 200})
                    for i in range(25)]
            failing = [queue.enqueue("csv.ingest", {"file": "orders-2026-11.csv", "row": 1817,
                                                    "broken": "31/11/2026", "broken_by": "import"}),
                       queue.enqueue("xlsx.ingest", {"file": "stock-<b>eu</b>.xlsx", "row": 4,
                                                     "broken": "<script>alert(1)</script>"})]
            for i in range(7):
                queue.enqueue("pdf.render", {"document": f"invoice-{4000 + i}",
                                             "seconds": 40 + 10 * i})
            deadline = time.monotonic() + 60
            while len(queue.list_jobs(status="failed")) < len(failing):
                if time.monotonic() > deadline:
                    raise SystemExit("the failing jobs did not fail")
                time.sleep(0.1)
            time.sleep(2)  # the renders report some progress
            # A history for the chart: the finished jobs spread over the last hour.
            queue.conn.execute(
                "UPDATE fairsched_jobs SET created_at = now() - (id * 53 % 3500) * interval '1 s',"
                " finished_at = now() - (id * 53 % 3500) * interval '1 s' + interval '2 s'"
                " WHERE status = 'succeeded'")
        out = Path(args.out)
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=shutil.which("chromium"),
                                        args=["--no-sandbox"])
            page = browser.new_page(viewport={"width": 1280, "height": 1000})
            page.goto(f"http://127.0.0.1:{port}/")
            page.wait_for_selector("#slots tr[data-state='busy']")
            page.wait_for_selector("#chart canvas")
            page.wait_for_selector("#jobs article.job")
            page.select_option("#job-status", "")
            page.wait_for_timeout(1500)
            page.locator("#jobs").evaluate("e => e.scrollTop = 0")
            page.screenshot(path=str(out / "dashboard-overview.png"))
            page.select_option("#job-status", "failed")
            page.wait_for_selector("#jobs article.job[data-status='failed']")
            page.locator("#jobs").scroll_into_view_if_needed()
            page.screenshot(path=str(out / "dashboard-dead-letters.png"))
            page.goto(f"http://127.0.0.1:{port}/job/{failing[1]}")
            page.wait_for_selector("#detail-fields pre.error")
            page.set_viewport_size({"width": 1000, "height": 760})
            page.screenshot(path=str(out / "dashboard-job.png"))
            browser.close()
        for name in ("overview", "dead-letters", "job"):
            path = out / f"dashboard-{name}.png"
            print(f"{path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}: "
                  f"{path.stat().st_size // 1024} KB")
    finally:
        proc.terminate()
        proc.wait(30)
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
