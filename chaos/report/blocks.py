"""What the report's document is made of, shared by its parts
(chaos/report/document.py, chaos/report/answer.py): a table with links and
severity classes per cell, the block list the document renders twice
(Markdown and HTML), and the names and anchors every part links by."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

RUNS = "runs"


@dataclass(frozen=True)
class Table:
    header: list[str]
    rows: list[list[str]]  # a cell's "\n" is a line break (HTML) or "; " (Markdown)
    links: list[list[str | None]] | None = None  # per cell: where it links to
    classes: list[list[str]] | None = None  # per cell: its severity (CSS class)
    row_ids: list[str | None] | None = None  # per row: an anchor
    css: str = ""  # the table's own CSS class


# ("h1"|"h2"|"h3"|"p"|"ul", text or items) | ("table", Table) | ("img", (alt, path))
# | ("link", (text, href))
Block = tuple[str, Any]


def mode_label(role: str, flush: str) -> str:
    return f"{role} + {flush}"


def plural(n: int, word: str) -> str:
    return f"{n:,} {word}{'' if n == 1 else 's'}"


def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def group_anchor(role: str, flush: str, scenario: str) -> str:
    return "runs-" + slug(f"{role} {flush} {scenario}")


def run_page(run_id: str) -> str:
    """The run's page, relative to the report."""
    return f"{RUNS}/{quote(run_id)}.html"


def severity(violations: int, stranded: int, lost_master: int) -> str:
    return ("violation" if violations else "stranded" if stranded
            else "loss" if lost_master else "ok")
