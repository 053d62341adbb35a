"""What the report's document is made of, shared by its parts
(chaos/report/document.py, chaos/report/answer.py): a table with links and
severity classes per cell, the block list the document renders twice
(Markdown and HTML), and the names and anchors every part links by."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple
from urllib.parse import quote

from chaos.check import promises
from chaos.harness import run_config

if TYPE_CHECKING:
    import pandas as pd

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


CLASSIC = "classic"


def mode_label(role: str, flush: str, ha: str = CLASSIC) -> str:
    """A mode as the report names it: ROLE + FLUSH in classic mode; in
    controller mode its settings, the role they make in brackets."""
    if ha == CLASSIC:
        return f"{role} + {flush}"
    return f"{ha} ({role}) + {flush}"


def ha_label(params: Any) -> str:
    """"classic", or controller mode with its settings as the report names
    them (from params.json's config; a run from before it is classic)."""
    cfg = params.get("config") or {}
    return run_config.ha_label(cfg.get("ha_mode", CLASSIC),
                               bool(cfg.get("all_ack_in_sync_state_set")),
                               int(cfg.get("in_sync_replicas", 1)),
                               int(cfg.get("min_in_sync_replicas", 1)),
                               bool(cfg.get("elect_unclean")))


class Mode(NamedTuple):
    """What the report groups runs by: the role and flush (whose promises
    the runs are judged by) and the HA mode with its settings ("classic",
    or e.g. "controller all-ack"; the verdicts' `ha` column)."""

    role: str
    flush: str
    ha: str = CLASSIC

    @property
    def label(self) -> str:
        return mode_label(self.role, self.flush, self.ha)

    def select(self, verdicts: pd.DataFrame) -> pd.Series:
        """The rows of `verdicts` (or any frame with role, flush, ha) of this mode."""
        ha = verdicts.get("ha", CLASSIC)
        return ((verdicts["role"] == self.role) & (verdicts["flush"] == self.flush)
                & (ha == self.ha))


def modes_in(verdicts: pd.DataFrame) -> list[Mode]:
    """The modes `verdicts` holds: classic ones first, each HA setting's in
    the promises' order."""
    has = verdicts["ha"] if "ha" in verdicts else [CLASSIC] * len(verdicts)
    present = set(zip(verdicts["role"], verdicts["flush"], has, strict=True))
    has_order = sorted({h for *_, h in present}, key=lambda h: (h != CLASSIC, h))
    return [Mode(r, f, h) for h in has_order for r, f in promises.PROMISES
            if (r, f, h) in present]


def plural(n: int, word: str) -> str:
    return f"{n:,} {word}{'' if n == 1 else 's'}"


def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def group_anchor(role: str, flush: str, scenario: str, ha: str = CLASSIC) -> str:
    return "runs-" + slug(f"{role} {flush} {scenario}" + ("" if ha == CLASSIC else f" {ha}"))


def run_page(run_id: str) -> str:
    """The run's page, relative to the report."""
    return f"{RUNS}/{quote(run_id)}.html"


def severity(violations: int, stranded: int, lost_master: int) -> str:
    return ("violation" if violations else "stranded" if stranded
            else "loss" if lost_master else "ok")
