#!/usr/bin/env python3
"""Write sample inputs for the example workers: PDFs (written by hand, no library needed),
Excel workbooks (openpyxl) and one file that is not a PDF, to see a job fail for good.

    .venv/bin/python examples/make_samples.py              # into examples/samples/
    .venv/bin/python examples/make_samples.py --out DIR
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

PDFS = {
    "report.pdf": ("Quarterly report", [
        ["Quarterly report", "Sales grew in every region.", "North led with 4,250 units."],
        ["Costs", "Freight rose by 3 percent.", "Staff costs stayed flat."],
        ["Outlook", "We expect a calm quarter."],
    ]),
    "invoice.pdf": ("Invoice 2024-0042", [
        ["Invoice 2024-0042", "Office chairs x 5", "Total due: 1,250.00 EUR"],
    ]),
    "manual.pdf": ("Operator manual", [
        [f"Chapter {n}", f"This is page {n} of the operator manual."] for n in range(1, 13)
    ]),
}

WORKBOOKS = {
    "sales.xlsx": {
        "North": [("month", "amount"), ("Jan", 1200), ("Feb", 1350.5), ("Mar", 1700)],
        "South": [("month", "amount"), ("Jan", 800), ("Feb", 950), ("Mar", 1025.25)],
        "East": [("month", "amount"), ("Jan", 300), ("Feb", 0), ("Mar", 450)],
    },
    "budget.xlsx": {
        "2024": [("item", "cost"), ("rent", 24000), ("staff", 180000), ("travel", 12500)],
        "2025": [("item", "cost"), ("rent", 24800), ("staff", 186000), ("travel", 9000)],
    },
}

NOT_A_PDF = "broken.pdf"


def _escape(text: str) -> bytes:
    return (text.replace("\\", "\\\\").replace("(", "\\(").replace(")", "\\)")
            .encode("latin-1"))


def pdf_bytes(title: str, pages: list[list[str]]) -> bytes:
    """A minimal valid PDF: one Helvetica text block per page, with a correct xref table."""
    n_pages = len(pages)
    # Objects: 1 catalog, 2 page tree, 3 font, 4 info, then a page and its content per page.
    page_ids = [5 + 2 * i for i in range(n_pages)]
    objects: dict[int, bytes] = {
        1: b"<< /Type /Catalog /Pages 2 0 R >>",
        2: b"<< /Type /Pages /Kids [" + b" ".join(b"%d 0 R" % i for i in page_ids)
           + b"] /Count %d >>" % n_pages,
        3: b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica /Encoding /WinAnsiEncoding >>",
        4: b"<< /Title (" + _escape(title) + b") /Producer (fairsched make_samples) >>",
    }
    for page_id, lines in zip(page_ids, pages, strict=True):
        text = b"BT /F1 14 Tf 18 TL 72 720 Td " + b" T* ".join(
            b"(" + _escape(line) + b") Tj" for line in lines) + b" ET"
        objects[page_id] = (b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] "
                            b"/Resources << /Font << /F1 3 0 R >> >> /Contents %d 0 R >>"
                            % (page_id + 1))
        objects[page_id + 1] = (b"<< /Length %d >>\nstream\n" % len(text) + text
                                + b"\nendstream")
    out = bytearray(b"%PDF-1.4\n%\xe2\xe3\xcf\xd3\n")
    offsets = {}
    for number in sorted(objects):
        offsets[number] = len(out)
        out += b"%d 0 obj\n" % number + objects[number] + b"\nendobj\n"
    xref = len(out)
    size = max(objects) + 1
    out += b"xref\n0 %d\n0000000000 65535 f \n" % size
    for number in range(1, size):
        out += b"%010d 00000 n \n" % offsets[number]
    out += b"trailer\n<< /Size %d /Root 1 0 R /Info 4 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (
        size, xref)
    return bytes(out)


def write_workbook(path: Path, sheets: dict[str, list[tuple]]) -> None:
    from openpyxl import Workbook

    book = Workbook()
    book.remove(book.active)
    for title, rows in sheets.items():
        sheet = book.create_sheet(title)
        for row in rows:
            sheet.append(row)
    book.save(path)


def make_samples(out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, (title, pages) in PDFS.items():
        (out / name).write_bytes(pdf_bytes(title, pages))
        written.append(out / name)
    (out / NOT_A_PDF).write_text("This file only pretends to be a PDF.\n")
    written.append(out / NOT_A_PDF)
    for name, sheets in WORKBOOKS.items():
        write_workbook(out / name, sheets)
        written.append(out / name)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Write sample PDFs and workbooks for the "
                                                 "example workers.")
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "samples",
                        help="folder to write into (default: examples/samples)")
    args = parser.parse_args(argv)
    try:
        written = make_samples(args.out)
    except ImportError as exc:
        print(f"make_samples: {exc.name or exc} is not installed: "
              "pip install 'fairsched[examples]'", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"make_samples: cannot write to {args.out}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    for path in written:
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
