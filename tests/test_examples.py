"""The shipped example, end to end: sample files, examples/workers.toml, real PDFs and workbooks."""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.supervisor_harness import Supervisor

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


@pytest.fixture
def samples(tmp_path) -> Path:
    out = tmp_path / "samples"
    made = subprocess.run([sys.executable, str(EXAMPLES / "make_samples.py"), "--out", str(out)],
                          capture_output=True, text=True, timeout=60)
    assert made.returncode == 0, made.stderr
    assert sorted(Path(line).name for line in made.stdout.split()) == [
        "broken.pdf", "budget.xlsx", "invoice.pdf", "manual.pdf", "report.pdf", "sales.xlsx"]
    return out


@pytest.fixture
def example(db):
    """A supervisor on a copy of examples/workers.toml and examples/handlers.py."""
    sup = Supervisor(db, "")
    try:
        sup.config.write_text((EXAMPLES / "workers.toml").read_text())
        shutil.copy(EXAMPLES / "handlers.py", sup.dir / "handlers.py")
        sup.start()
        yield sup
    finally:
        sup.close()


def on_demand(sup, type_name: str, payload: dict) -> dict:
    result = sup.cli("submit", type_name, "--on-demand", "--payload", json.dumps(payload))
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def jobs_by_id(sup) -> dict[int, dict]:
    result = sup.cli("jobs", "--json")
    assert result.returncode == 0, result.stderr
    return {job["id"]: job for job in json.loads(result.stdout)}


def test_pdf_excel_and_a_worker_killed(example, samples):
    sup = example
    slots = sup.slots()
    assert [(s["worker"], s["slot"]) for s in slots] == [
        ("pdf-1", 0), ("pdf-2", 0), ("excel-1", 0), ("office-1", 0), ("office-1", 1)]

    report = on_demand(sup, "pdf", {"path": str(samples / "report.pdf")})
    assert report["pages"] == 3 and report["title"] == "Quarterly report"
    assert report["text"] == ("Quarterly report\nSales grew in every region.\n"
                              "North led with 4,250 units.")
    # Specialist first: the pdf workers take pdf jobs while the office worker waits.
    assert report["pid"] in {s["pid"] for s in slots if s["group"] == "pdf"}

    invoice = on_demand(sup, "pdf", {"path": str(samples / "invoice.pdf")})
    assert invoice["pages"] == 1 and invoice["text"].endswith("\nTotal due: 1,250.00 EUR")

    sales = on_demand(sup, "excel", {"path": str(samples / "sales.xlsx")})
    assert sales["sheets"] == {"North": 4250.5, "South": 2775.25, "East": 750}
    assert sales["rows"] == {"North": 4, "South": 4, "East": 4}

    index = on_demand(sup, "index", {"text": "to be or not to be"})
    assert index["terms"] == 4 and index["index"]["be"] == [1, 5]

    manual = sup.enqueue("pdf", "--priority", "5", payload={"path": str(samples / "manual.pdf")})
    budget = sup.enqueue("excel", payload={"path": str(samples / "budget.xlsx")})
    broken = sup.enqueue("pdf", payload={"path": str(samples / "broken.pdf")})
    sup.wait_for(lambda ps: all(jobs_by_id(sup)[i]["status"] in ("succeeded", "failed")
                                for i in (manual, budget, broken)), what="the queued jobs")
    jobs = jobs_by_id(sup)
    assert jobs[manual]["status"] == "succeeded"
    assert jobs[manual]["result"]["pages"] == 12
    assert jobs[manual]["result"]["text"].startswith("Chapter 1\n")
    assert jobs[budget]["status"] == "succeeded"
    assert jobs[budget]["result"]["sheets"] == {"2024": 216500, "2025": 219800}
    # Not a PDF: a permanent failure, never retried, kept in the dead-letter list.
    assert jobs[broken]["status"] == "failed" and jobs[broken]["attempts"] == 1
    assert "not a readable PDF" in jobs[broken]["last_error"]
    dead = sup.cli("jobs", "--status", "failed")
    assert dead.returncode == 0, dead.stderr
    assert [line.split()[0] for line in dead.stdout.splitlines()[1:]] == [str(broken)]

    old = next(s for s in sup.slots("excel-1"))
    os.kill(old["pid"], signal.SIGKILL)
    ps = sup.wait_for(lambda ps: any(s["worker"] == "excel-1" and s["state"] == "free"
                                     and s["pid"] != old["pid"] for s in ps["slots"]),
                      what="excel-1 back")
    new = next(s for s in ps["slots"] if s["worker"] == "excel-1")
    assert new["restarts"] == old["restarts"] + 1
    again = on_demand(sup, "excel", {"path": str(samples / "sales.xlsx")})
    assert again["pid"] == new["pid"] and again["sheets"] == sales["sheets"]
    assert "worker excel-1 killed by SIGKILL" in sup.output()

    # A paced job, watched in ps and cancelled there, as the README shows.
    slow = sup.enqueue("pdf", payload={"path": str(samples / "manual.pdf"), "pace": 2})
    ps = sup.wait_for(lambda ps: any(s["job_id"] == slow and s["message"] == "page 2/12"
                                     for s in ps["slots"]), what="the paced job's progress")
    row = next(s for s in ps["slots"] if s["job_id"] == slow)
    # The share done: one page of twelve, while it works on the second.
    assert row["group"] == "pdf" and row["state"] == "busy" and row["progress"] == 1 / 12
    assert sup.cli("cancel", str(slow)).returncode == 0
    sup.wait_for(lambda ps: jobs_by_id(sup)[slow]["status"] == "cancelled", what="cancelled")

    # A payload of the wrong shape fails at once, for good: a retry would get it again.
    odd = sup.cli("submit", "index", "--on-demand", "--payload", "[1, 2]")
    assert odd.returncode == 1
    assert "the payload must be a JSON object" in odd.stderr, odd.stderr
    assert re.search(r"job od-\d+ failed for good: .*the payload must be a JSON object",
                     sup.output()), sup.output()[-2000:]
    bad_pace = sup.enqueue("pdf", payload={"path": str(samples / "manual.pdf"), "pace": "fast"})
    sup.wait_for(lambda ps: jobs_by_id(sup)[bad_pace]["status"] == "failed", what="failed")
    assert jobs_by_id(sup)[bad_pace]["attempts"] == 1
    assert "payload field 'pace' must be a number of seconds" in jobs_by_id(sup)[bad_pace][
        "last_error"]

    stopped = sup.cli("stop")
    assert stopped.returncode == 0, stopped.stderr
    assert sup.wait_exit() == 0


def test_make_samples_reports_an_unwritable_folder(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    made = subprocess.run([sys.executable, str(EXAMPLES / "make_samples.py"),
                           "--out", str(blocker / "samples")], capture_output=True, text=True,
                          timeout=60)
    assert made.returncode == 2
    assert made.stderr.startswith("make_samples: cannot write to ")
    assert "Traceback" not in made.stderr and len(made.stderr.splitlines()) == 1


def first_end(sup, job_id: int) -> dict:
    """The job once it has failed, or has come to a second attempt instead."""
    sup.wait_for(lambda ps: jobs_by_id(sup)[job_id]["status"] == "failed"
                 or jobs_by_id(sup)[job_id]["attempts"] > 1, what="the job to end")
    return jobs_by_id(sup)[job_id]


def test_a_pdf_broken_past_its_header_fails_for_good_at_once(example, samples):
    # The file opens as a PDF, but its page tree is not one: reading it again cannot help.
    report = (samples / "report.pdf").read_bytes()
    assert b"/Kids [5 0 R 7 0 R 9 0 R]" in report
    (samples / "pages.pdf").write_bytes(report.replace(b"/Kids [5 0 R 7 0 R 9 0 R]",
                                                       b"/Kids 5 0 R"))
    sup = example
    broken = sup.enqueue("pdf", payload={"path": str(samples / "pages.pdf")})
    job = first_end(sup, broken)
    assert (job["status"], job["attempts"]) == ("failed", 1), job
    assert "pages.pdf: not a readable PDF: " in job["last_error"], job["last_error"]
    assert sup.slots("pdf-1")[0]["restarts"] == 0 and sup.slots("pdf-2")[0]["restarts"] == 0


def test_an_encrypted_pdf_fails_for_good_saying_so(example, samples):
    from pypdf import PdfReader, PdfWriter

    writer = PdfWriter(clone_from=PdfReader(samples / "report.pdf"))
    writer.encrypt(user_password="secret", algorithm="RC4-128")
    with open(samples / "locked.pdf", "wb") as f:
        writer.write(f)
    sup = example
    locked = sup.enqueue("pdf", payload={"path": str(samples / "locked.pdf")})
    job = first_end(sup, locked)
    assert (job["status"], job["attempts"]) == ("failed", 1), job
    assert "locked.pdf: the PDF is encrypted" in job["last_error"], job["last_error"]


def test_a_workbook_broken_past_its_header_fails_for_good_at_once(example, samples):
    # The workbook opens, but one sheet's XML is cut short: reading it again cannot help.
    import zipfile

    with zipfile.ZipFile(samples / "sales.xlsx") as good, \
            zipfile.ZipFile(samples / "cut.xlsx", "w") as cut:
        for name in good.namelist():
            data = good.read(name)
            cut.writestr(name, data[:len(data) // 2] if name.endswith("sheet2.xml") else data)
    sup = example
    broken = sup.enqueue("excel", payload={"path": str(samples / "cut.xlsx")})
    job = first_end(sup, broken)
    assert (job["status"], job["attempts"]) == ("failed", 1), job
    assert "cut.xlsx: not a readable workbook: " in job["last_error"], job["last_error"]


@pytest.mark.parametrize("pace", [-1, 1e300])
def test_a_pace_no_sleep_takes_fails_for_good_at_once(example, samples, pace):
    sup = example
    odd = sup.enqueue("pdf", payload={"path": str(samples / "invoice.pdf"), "pace": pace})
    job = first_end(sup, odd)
    assert (job["status"], job["attempts"]) == ("failed", 1), job
    assert "payload field 'pace' must be a number of seconds" in job["last_error"], job


def a_pdf(samples: Path, name: str, title: str) -> Path:
    sys.path.insert(0, str(EXAMPLES))
    try:
        from make_samples import PDFS, pdf_bytes
    finally:
        sys.path.remove(str(EXAMPLES))
    (samples / name).write_bytes(pdf_bytes(title, PDFS["report.pdf"][1]))
    return samples / name


def test_a_nul_in_a_pdf_title_is_kept_queued_or_on_demand(example, samples):
    # A title ending in NUL (the end of a C string, as some tools write it) succeeded on
    # demand, but its queued job failed: "result contains a NUL character".
    from pypdf import PdfReader, PdfWriter

    sup = example
    ended = a_pdf(samples, "ended.pdf", "Quarterly report\x00")
    # One inside the title is the title's own: kept. (pypdf writes it as UTF-16.)
    writer = PdfWriter(clone_from=PdfReader(samples / "report.pdf"))
    writer.add_metadata({"/Title": "Quarterly\x00report"})
    inside = samples / "inside.pdf"
    with open(inside, "wb") as f:
        writer.write(f)
    assert on_demand(sup, "pdf", {"path": str(ended)})["title"] == "Quarterly report"
    assert on_demand(sup, "pdf", {"path": str(inside)})["title"] == "Quarterly\x00report"
    queued = {sup.enqueue("pdf", payload={"path": str(path)}): path for path in (ended, inside)}
    sup.wait_for(lambda ps: all(jobs_by_id(sup)[i]["status"] in ("succeeded", "failed")
                                for i in queued), what="the queued jobs")
    titles = {queued[i].name: job["result"]["title"] for i, job in jobs_by_id(sup).items()
              if job["status"] == "succeeded"}
    assert titles == {"ended.pdf": "Quarterly report", "inside.pdf": "Quarterly\x00report"}


def test_a_pdf_whose_xref_table_is_wrong_is_read_all_the_same(example, samples):
    report = (samples / "report.pdf").read_bytes()
    xref = report.index(b"xref\n")
    # Offsets one byte off, as an editing tool leaves them: pypdf finds the objects anyway.
    (samples / "offsets.pdf").write_bytes(report[:xref] + report[xref:].replace(
        b"0000000", b"0000001", 4))
    # No xref table, no startxref: nothing to read it by, for good.
    (samples / "no-xref.pdf").write_bytes(report[:xref] + b"%%EOF\n")
    sup = example
    read = on_demand(sup, "pdf", {"path": str(samples / "offsets.pdf")})
    assert (read["pages"], read["title"]) == (3, "Quarterly report")
    broken = sup.enqueue("pdf", payload={"path": str(samples / "no-xref.pdf")})
    job = first_end(sup, broken)
    assert (job["status"], job["attempts"]) == ("failed", 1), job
    assert "no-xref.pdf: not a readable PDF: " in job["last_error"], job["last_error"]


def test_an_encrypted_pdf_without_a_user_password_is_read(example, samples):
    # An owner password only (printing or editing forbidden): any reader opens it.
    from pypdf import PdfReader, PdfWriter

    writer = PdfWriter(clone_from=PdfReader(samples / "report.pdf"))
    writer.encrypt(user_password="", owner_password="owner", algorithm="RC4-128")
    with open(samples / "owned.pdf", "wb") as f:
        writer.write(f)
    # The same, marked AES: pypdf reads AES only with the cryptography package.
    owned = (samples / "owned.pdf").read_bytes()
    assert b"/V 2\n/R 3\n" in owned
    (samples / "aes.pdf").write_bytes(owned.replace(b"/V 2\n/R 3\n", (
        b"/V 4\n/R 4\n/CF << /StdCF << /CFM /AESV2 /AuthEvent /DocOpen /Length 16 >> >>\n"
        b"/StmF /StdCF\n/StrF /StdCF\n")))
    sup = example
    read = on_demand(sup, "pdf", {"path": str(samples / "owned.pdf")})
    assert (read["pages"], read["title"]) == (3, "Quarterly report")
    aes = sup.enqueue("pdf", payload={"path": str(samples / "aes.pdf")})
    job = first_end(sup, aes)
    assert (job["status"], job["attempts"]) == ("failed", 1), job
    assert "aes.pdf: the PDF is encrypted with AES, which takes the cryptography package" in (
        job["last_error"]), job["last_error"]


def rewrite_sheets(source: Path, target: Path, change) -> None:
    """A copy of workbook `source` whose worksheets' XML went through change(text)."""
    import zipfile

    with zipfile.ZipFile(source) as good, \
            zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as out:
        for name in good.namelist():
            data = good.read(name)
            if name.startswith("xl/worksheets/sheet"):
                data = change(data.decode()).encode()
            out.writestr(name, data)


def whole_grid(text: str) -> str:
    """A sheet that says it spans the whole grid, as some tools write it, and holds empty
    (formatted) rows down to row 200,000."""
    text = re.sub(r'<dimension ref="[^"]*"', '<dimension ref="A1:XFD1048576"', text)
    rows = "".join(f'<row r="{i}" customFormat="1"/>' for i in range(5, 200_001))
    return text.replace("</sheetData>", rows + "</sheetData>")


def test_a_workbook_that_says_it_fills_the_whole_grid_is_read_as_it_is(example, samples):
    # Each row was read 16,384 cells wide, as the sheet's size said: 600 rows a second, the
    # slot pinned until the timeout (and twice more on retries).
    rewrite_sheets(samples / "sales.xlsx", samples / "grid.xlsx", whole_grid)
    sup = example
    result = sup.cli("submit", "excel", "--on-demand", "--timeout", "60", "--payload",
                     json.dumps({"path": str(samples / "grid.xlsx")}))
    assert result.returncode == 0, result.stderr
    sales = json.loads(result.stdout)
    assert sales["sheets"] == {"North": 4250.5, "South": 2775.25, "East": 750}
    assert sales["rows"] == {"North": 4, "South": 4, "East": 4}


def test_a_workbook_past_the_cell_cap_fails_for_good_naming_it(example, samples):
    # Each row holds a cell in the last column: 16,384 cells a row, read or not.
    from openpyxl import Workbook

    book = Workbook()
    for row in range(1, 7000):
        book.active.cell(row=row, column=16384, value=1)
    book.save(samples / "wide.xlsx")
    sup = example
    wide = sup.enqueue("excel", payload={"path": str(samples / "wide.xlsx")})
    job = first_end(sup, wide)
    assert (job["status"], job["attempts"]) == ("failed", 1), job
    assert ("wide.xlsx: more than 100,000,000 empty cells within its rows (sheet 'Sheet', row "
            "6104 of those with values)") in job["last_error"], job["last_error"]


def test_a_long_sheet_stops_on_a_cancel_without_its_worker_stopped(example, samples):
    # One sheet of 300,000 rows: the handler asked job.cancelled() only between sheets, so
    # the cancel waited for the whole sheet.
    rows = "".join(f'<row r="{i}"><c r="A{i}"><v>{i}</v></c><c r="B{i}"><v>1</v></c></row>'
                   for i in range(1, 300_001))
    rewrite_sheets(samples / "budget.xlsx", samples / "long.xlsx", lambda text: re.sub(
        r"<sheetData>.*</sheetData>", "<sheetData>" + rows + "</sheetData>", text, flags=re.S))
    sup = example
    long = sup.enqueue("excel", payload={"path": str(samples / "long.xlsx")})
    ps = sup.wait_for(lambda ps: any(s["job_id"] == long and s["message"] == "2024"
                                     for s in ps["slots"]), what="the first sheet being read")
    worker = next(s for s in ps["slots"] if s["job_id"] == long)
    assert sup.cli("cancel", str(long)).returncode == 0
    sup.wait_for(lambda ps: jobs_by_id(sup)[long]["status"] == "cancelled", what="cancelled")
    after = next(s for s in sup.slots(worker["worker"]) if s["slot"] == worker["slot"])
    assert (after["pid"], after["restarts"]) == (worker["pid"], worker["restarts"])
    assert "stopping the worker" not in sup.output()
