"""Plain-text tables and grep hits, shared by ``/trove`` and ``scripts/trove.py``.

One renderer, so ``/trove grep`` in the chat and ``trove.py grep`` in a shell
print the same lines for the same hits (the shell may add colour on a terminal).
"""

from __future__ import annotations

import os
import re
import sys

SNIPPET_CHARS = 100


def highlight(text: str, terms: list[str], color: str = "auto") -> str:
    """``text`` with each query term in bold red (ANSI) with ``color="always"``, or with
    ``auto`` when stdout is a terminal and ``NO_COLOR`` is unset; plain otherwise, so
    pipes (and the chat) get the exact snippet."""
    if color == "auto":
        color = "always" if sys.stdout.isatty() and not os.environ.get("NO_COLOR") else "never"
    if not terms or color == "never":
        return text
    pattern = re.compile("|".join(re.escape(t) for t in sorted(terms, key=len, reverse=True)),
                         re.IGNORECASE)
    return pattern.sub(lambda m: f"\033[1;31m{m.group(0)}\033[0m", text)


def one_line(text, limit: int = SNIPPET_CHARS, terms: list[str] = ()) -> str:
    """A text squeezed onto one table cell; when cut, the window holds the first match
    of ``terms`` (a summary's snippet must show why it matched)."""
    flat = " ".join(str(text or "").split())
    if len(flat) <= limit:
        return flat
    lowered = flat.lower()
    found = [at for at in (lowered.find(t.lower()) for t in terms) if at >= 0]
    start = max(0, min(min(found) - limit // 3, len(flat) - limit + 2)) if found else 0
    piece = flat[start:start + limit - 2]
    return ("…" if start else "") + piece + ("…" if start + len(piece) < len(flat) else "")


def table(headers: list[str], rows: list[list]) -> str:
    """Left-aligned columns sized to their content."""
    cells = [[str(c) for c in row] for row in rows]
    widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(headers)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths)).rstrip()]
    lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in cells]
    return "\n".join(lines)


def format_grep(report: dict, session: str | None = None, color: str = "never",
                next_page: str = "--offset {}") -> str:
    """The hits of ``operators.search.grep`` as a table, its notes, and how to get the
    next page (``next_page`` names the front end's own option)."""
    terms = report.get("terms", [])
    rows = [[f"m{r['store_id']}" if r["kind"] == "message" else f"n{r['node_id']}",
             r.get("session_id") or session or "", r.get("role") or f"d{r.get('depth')}",
             r.get("time") or r.get("time_to") or "",
             highlight(one_line(r.get("snippet"), terms=terms), terms, color)
             + (f" (same copy in {', '.join(r['also_in'])})" if r.get("also_in") else "")]
            for r in report["results"]]
    text = table(["id", "session", "role", "time", "snippet"], rows) if rows else "no matches"
    mode = [f"search mode: {report['mode']}"] if report.get("mode") else []
    notes = [f"note: {n}" for n in report.get("notes", [])]
    more = ([f"more results: {next_page.format(report['next_offset'])}"]
            if report.get("next_offset") else [])
    return "\n".join([text] + mode + notes + more)
