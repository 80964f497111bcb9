"""Example handlers for examples/workers.toml: PDF, Excel and a versatile office worker.

The PDF and Excel handlers take a payload {"path": ...} (relative paths start from this
folder, the workers' working directory; `examples/make_samples.py` writes some into samples/),
the index handler {"text": ...}, the words to index. Without a path a handler reports what
it would do, so the quickstart works before any sample file exists. A file that is missing or
unreadable fails the job for good: retrying cannot help. The PDF handler also takes "pace":
seconds to spend on each page, as a slow renderer (OCR, say) would, to watch a job's progress
in `fairsched ps` and cancel it there.
"""

import os
import time

import fairsched

TEXT = (str, "a string")
MAX_PACE = 86400  # seconds per page


def options(job: fairsched.Job, **expected: tuple[type, str]) -> dict:
    """The payload's fields, each of the type expected (type, its name for users) or
    absent; anything else fails the job for good (a retry would get the same payload)."""
    payload = {} if job.payload is None else job.payload
    if not isinstance(payload, dict):
        raise fairsched.PermanentError(f"the payload must be a JSON object such as "
                                       f'{{"path": "samples/a.pdf"}}, got {type(payload).__name__}')
    for key, (kind, name) in expected.items():
        if key in payload and not isinstance(payload[key], kind):
            raise fairsched.PermanentError(f"payload field {key!r} must be {name}, got "
                                           f"{payload[key]!r:.60}")
    return payload


def render_pdf(job: fairsched.Job):
    payload = options(job, path=TEXT, pace=(int | float, "a number of seconds"))
    path = payload.get("path")
    if path is None:
        for step in range(1, 4):
            job.progress((step - 1) / 3, f"page {step}/3")  # the share done so far
            if job.cancelled():
                return None
            time.sleep(0.05)
        return {"pages": 3, "pid": os.getpid()}
    from pypdf import PdfReader
    from pypdf.errors import PyPdfError

    pace = float(payload.get("pace", 0))
    if not 0 <= pace <= MAX_PACE:  # time.sleep refuses less than 0, and past ~1e10 s
        raise fairsched.PermanentError(f"payload field 'pace' must be a number of seconds "
                                       f"from 0 to {MAX_PACE}, got {pace:g}")
    pages = []
    # A file can open as a PDF and break further on (its page tree, a page's stream): that
    # too is the file's own, and reading it again cannot help.
    try:
        reader = PdfReader(path)
        if reader.is_encrypted:  # AES would need the cryptography package, and a password
            raise fairsched.PermanentError(f"{path}: the PDF is encrypted; give the worker "
                                           "a copy without a password")
        title = reader.metadata.title if reader.metadata else None
        for number, page in enumerate(reader.pages, 1):
            job.progress((number - 1) / len(reader.pages), f"page {number}/{len(reader.pages)}")
            if job.cancelled():
                return None
            pages.append(page.extract_text() or "")
            time.sleep(pace)
    except (OSError, PyPdfError) as exc:
        raise fairsched.PermanentError(f"{path}: not a readable PDF: {exc}") from None
    return {"pages": len(pages), "title": title, "chars": sum(map(len, pages)),
            "text": pages[0][:200] if pages else "", "pid": os.getpid()}


def read_excel(job: fairsched.Job):
    path = options(job, path=TEXT).get("path")
    if path is None:
        return {"sheets": {}, "pid": os.getpid()}
    import zlib
    from zipfile import BadZipFile

    from openpyxl import load_workbook
    from openpyxl.utils.exceptions import InvalidFileException

    # An XML parse error (ElementTree's or lxml's) is a SyntaxError; zlib.error, a member
    # of the zip that does not inflate. A read-only workbook reads each sheet as it goes, so
    # a sheet broken past the workbook's header shows only there: the file's own fault too.
    unreadable = (OSError, BadZipFile, InvalidFileException, KeyError, ValueError, SyntaxError,
                  zlib.error)
    try:
        book = load_workbook(path, read_only=True, data_only=True)
    except unreadable as exc:
        raise fairsched.PermanentError(f"{path}: not a readable workbook: {exc}") from None
    sums, rows = {}, {}
    try:
        for number, sheet in enumerate(book.worksheets, 1):
            job.progress((number - 1) / len(book.worksheets), sheet.title)
            if job.cancelled():
                return None
            total, count = 0.0, 0
            for row in sheet.iter_rows(values_only=True):
                count += 1
                total += sum(v for v in row
                             if isinstance(v, int | float) and not isinstance(v, bool))
            sums[sheet.title] = total
            rows[sheet.title] = count
    except unreadable as exc:
        raise fairsched.PermanentError(f"{path}: not a readable workbook: {exc}") from None
    finally:
        book.close()  # read-only workbooks keep the file open until closed
    return {"sheets": sums, "rows": rows, "pid": os.getpid()}


def build_index(job: fairsched.Job):
    words = options(job, text=TEXT).get("text", "").lower().split()
    index = {}
    for position, word in enumerate(words):
        index.setdefault(word, []).append(position)
    return {"terms": len(index), "index": index}


def office(job: fairsched.Job):
    """The versatile worker: whatever type it is handed."""
    return {"pdf": render_pdf, "excel": read_excel, "index": build_index}[job.type](job)
