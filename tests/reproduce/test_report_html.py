"""``report.html`` is ``report.md`` rendered: every heading and every table row's cells of the one are in the other,
in the same order, so the two cannot drift apart."""

from __future__ import annotations

import re
from html.parser import HTMLParser
from pathlib import Path

import pytest
from markdown_it import MarkdownIt

from attnzoo.reproduce.report import html_page

RESULTS_MD = Path(__file__).resolve().parents[2] / "docs" / "results.md"
_INLINE = MarkdownIt("commonmark")


class _Structure(HTMLParser):
    """The text of every heading and the cells of every table row of an HTML page."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.headings: list[str] = []
        self.rows: list[list[str]] = []
        self._text: list[str] | None = None

    def handle_starttag(self, tag: str, attrs) -> None:
        if tag == "tr":
            self.rows.append([])
        if re.fullmatch(r"h[1-6]|td|th", tag):
            self._text = []

    def handle_endtag(self, tag: str) -> None:
        if self._text is None:
            return
        text = "".join(self._text).strip()
        if re.fullmatch(r"h[1-6]", tag):
            self.headings.append(text)
            self._text = None
        elif tag in ("td", "th"):
            self.rows[-1].append(text)
            self._text = None

    def handle_data(self, data: str) -> None:
        if self._text is not None:
            self._text.append(data)


def _plain(md_inline: str) -> str:
    """The text a reader sees of an inline markdown fragment (markup dropped, entities read)."""
    s = _Structure()
    s.feed("<tr><td>" + _INLINE.renderInline(md_inline) + "</td></tr>")
    return s.rows[0][0]


def _md_structure(md: str) -> tuple[list[str], list[list[str]]]:
    """The headings and the table rows' cells of a markdown report (its tables are one line per row)."""
    headings, rows = [], []
    for line in md.splitlines():
        if m := re.fullmatch(r"#{1,6} (.*)", line):
            headings.append(_plain(m[1]).strip())
        elif line.startswith("|") and not line.startswith("|---"):
            cells = re.split(r"(?<!\\)\|", line.strip())[1:-1]
            rows.append([_plain(c.strip().replace("\\|", "|")).strip() for c in cells])
    return headings, rows


def drift(md: str, page: str) -> list[str]:
    """Where ``page`` is not ``md`` rendered: a heading or a table row that differs, is missing or is extra."""
    want_h, want_rows = _md_structure(md)
    got = _Structure()
    got.feed(page)
    out = []
    for what, want, have in (("heading", want_h, got.headings), ("table row", want_rows, got.rows)):
        out += [f"{what} {i}: md {a!r}, html {b!r}" for i, (a, b) in enumerate(zip(want, have, strict=False)) if a != b]
        if len(want) != len(have):
            out.append(f"{len(want)} {what}s in the markdown, {len(have)} in the html")
    return out


def test_the_committed_report_renders_with_every_heading_and_table_row():
    md = RESULTS_MD.read_text()
    page = html_page(md, "attnzoo reproduce (long budget)")
    headings, rows = _md_structure(md)
    assert len(headings) > 20 and len(rows) > 150  # the long run's report: every section, about 25 tables
    assert drift(md, page) == []
    assert page.startswith("<!doctype html>") and "<meta charset='utf-8'>" in page
    assert "<title>attnzoo reproduce (long budget)</title>" in page
    # the contents' links land on the headings' anchors
    ids = set(re.findall(r'id="([^"]+)"', page))
    links = re.findall(r"\]\(#([^)]+)\)", md)
    assert links and [a for a in links if a not in ids] == []


def test_a_planted_difference_is_found():
    md = RESULTS_MD.read_text()
    page = html_page(md, "attnzoo reproduce (long budget)")
    cell = "<td>not tested</td>"
    assert cell in page
    assert drift(md, page.replace(cell, "<td>tested</td>", 1))  # a changed cell
    assert drift(md, page.replace("<h2", "<p", 1))  # a heading lost
    assert drift(md.replace("| not tested |", "| tested |", 1), page)  # the markdown moved on alone
    i = page.index("<tr>", page.index("<tbody>"))
    assert drift(md, page[:i] + page[page.index("</tr>", i) + 5 :])  # a row dropped


@pytest.mark.slow
def test_the_written_report_html_is_report_md(smoke):
    md, page = (smoke / "report.md").read_text(), (smoke / "report.html").read_text()
    assert drift(md, page) == []
    assert drift(md, page.replace("<td>", "<td>x", 1))
