"""The HTML shell shared by the report pages: one self-contained file, nothing fetched.

The Content-Security-Policy forbids every fetch (``default-src 'none'``); styles are
inline and charts are inline SVG (:mod:`dpsub_dist.report.svg`), so a page opened from
disk, a bucket or a mail attachment looks the same and asks no server for anything.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from html import escape

from dpsub_dist.io.output import Written

CSP = "default-src 'none'; style-src 'unsafe-inline'"
GENERATOR = '<meta name="generator" content="dpsub report">'
"""In every page's head: how ``dpsub report --out`` knows a page it may replace."""
PAGE = Written("dpsub report page", "", lambda data: GENERATOR.encode() in (data or b"")[:4096])

STYLE = """
body { font: 15px/1.45 system-ui, sans-serif; color: #222; margin: 24px auto; max-width: 900px;
       padding: 0 16px; background: #fff; }
h1 { font-size: 24px; margin-bottom: 4px; } h2 { font-size: 18px; margin-top: 28px; }
.free { background: #eef6ee; border-left: 4px solid #2e9b47; padding: 8px 12px; }
.operator { background: #fff4e5; border: 2px dashed #e07b1a; padding: 8px 16px; margin-top: 32px; }
.operator h2 { color: #a65300; }
table { border-collapse: collapse; margin: 8px 0; }
td, th { border-bottom: 1px solid #ddd; padding: 3px 10px 3px 0; text-align: left;
         vertical-align: top; }
.chart text { font: 12px system-ui, sans-serif; fill: #222; }
.chart .ctitle { font-weight: 600; }
.flag { color: #c0392b; font-weight: 600; } .chart .flagtext { fill: #c0392b; }
.muted { color: #666; }
"""


def document(title: str, sections: Iterable[str]) -> str:
    """A complete HTML page: CSP, inline style, the title as heading, then the sections."""
    return (
        "<!doctype html>\n"
        '<html lang="en"><head><meta charset="utf-8">'
        f'<meta http-equiv="Content-Security-Policy" content="{CSP}">'
        '<meta name="viewport" content="width=device-width">'
        f"{GENERATOR}<title>{escape(title)}</title><style>{STYLE}</style></head>"
        f"<body><h1>{escape(title)}</h1>{''.join(sections)}</body></html>\n"
    )


def section(ident: str, heading: str, *body: str, css: str = "") -> str:
    """``<section id=…>`` with an ``<h2>`` and the given (already escaped) HTML."""
    klass = f' class="{css}"' if css else ""
    return f'<section id="{ident}"{klass}><h2>{escape(heading)}</h2>{"".join(body)}</section>'


def table(header: Sequence[str], rows: Iterable[Sequence[str]], ident: str = "") -> str:
    """A table of already escaped cells."""
    head = "".join(f"<th>{escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in rows)
    name = f' id="{ident}"' if ident else ""
    return f"<table{name}><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def para(text: str, css: str = "") -> str:
    """A paragraph of plain text (escaped here)."""
    klass = f' class="{css}"' if css else ""
    return f"<p{klass}>{escape(text)}</p>"
