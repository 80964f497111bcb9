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
# Cells of a workbook read, at most: those holding a value (each takes microseconds to parse),
# and the empty ones a row is filled with up to its last cell (a stray cell in the last column,
# XFD, makes 16,384 of a row; fast, but not free).
MAX_CELLS = 5_000_000
MAX_EMPTY_CELLS = 100_000_000


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
    from pypdf.errors import DependencyError

    pace = float(payload.get("pace", 0))
    if not 0 <= pace <= MAX_PACE:  # time.sleep refuses less than 0, and past ~1e10 s
        raise fairsched.PermanentError(f"payload field 'pace' must be a number of seconds "
                                       f"from 0 to {MAX_PACE}, got {pace:g}")
    pages = []
    # A file can open as a PDF and break further on (its page tree, a page's stream): that
    # too is the file's own, and reading it again cannot help. pypdf repairs what it can (an
    # xref table whose offsets are wrong, as editing tools leave them) and raises whatever its
    # parser meets in what it cannot, not only its own errors.
    try:
        reader = PdfReader(path)
        if reader.is_encrypted:
            unlock(reader, path)
        title = pdf_title(reader)
        for number, page in enumerate(reader.pages, 1):
            job.progress((number - 1) / len(reader.pages), f"page {number}/{len(reader.pages)}")
            if job.cancelled():
                return None
            pages.append(page.extract_text() or "")
            time.sleep(pace)
    except fairsched.PermanentError:
        raise
    except DependencyError:  # AES: pypdf needs the cryptography package for it
        raise fairsched.PermanentError(f"{path}: the PDF is encrypted with AES, which takes "
                                       "the cryptography package (pip install cryptography); "
                                       "or give the worker a copy without encryption") from None
    except Exception as exc:
        raise fairsched.PermanentError(f"{path}: not a readable PDF: "
                                       f"{type(exc).__name__}: {exc}") from None
    return {"pages": len(pages), "title": title, "chars": sum(map(len, pages)),
            "text": pages[0][:200] if pages else "", "pid": os.getpid()}


def unlock(reader, path: str) -> None:
    """Open an encrypted PDF that needs no password to read (an owner password only, as
    tools set to forbid printing or editing); one that needs a password fails for good."""
    from pypdf import PasswordType

    if reader.decrypt("") == PasswordType.NOT_DECRYPTED:
        raise fairsched.PermanentError(f"{path}: the PDF is encrypted with a password; give "
                                       "the worker a copy without one")


def pdf_title(reader) -> str | None:
    """The document's title, or None when it has none or its metadata is broken (the pages
    may be fine). Trailing NUL characters, the end of a C string that some tools write into
    it, are dropped; any other character is kept."""
    try:
        title = reader.metadata.title if reader.metadata else None
    except Exception:
        return None
    return title.rstrip("\x00") if isinstance(title, str) else None


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
    sums, rows, cells, empty = {}, {}, 0, 0
    try:
        for number, sheet in enumerate(book.worksheets, 1):
            job.progress((number - 1) / len(book.worksheets), sheet.title)
            if job.cancelled():
                return None
            # The size a sheet declares can be the whole grid (A1:XFD1048576, as some tools
            # write it), and read-only mode would widen every row to it, 16,384 cells: only
            # the rows and cells the file holds are read.
            sheet.reset_dimensions()
            total, count = 0.0, 0
            for row in sheet.iter_rows(values_only=True):
                if job.cancelled():  # a sheet can take minutes: asked on every row
                    return None
                values = [v for v in row if v is not None]
                cells += len(values)
                empty += len(row) - len(values) or 1  # an empty row costs as much as a cell
                if cells > MAX_CELLS or empty > MAX_EMPTY_CELLS:
                    what = (f"{MAX_CELLS:,} cells with a value" if cells > MAX_CELLS else
                            f"{MAX_EMPTY_CELLS:,} empty cells within its rows")
                    raise fairsched.PermanentError(
                        f"{path}: more than {what} (sheet {sheet.title!r}, row {count + 1} of "
                        "those with values); split the workbook, or clear the cells far off")
                if values:
                    count += 1
                    total += sum(v for v in values
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
