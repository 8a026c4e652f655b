"""Making summary nodes: leaf passes over raw messages, condensation over nodes.

The engine decides *when* and *which* messages to compact; this module turns
them into nodes with exact lineage. Each node's text ends with a footer saying
what can be expanded from it, so a model reading the summary knows how to
drill back to the exact turns.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Mapping, Sequence

from ..storage import codec, prepared
from ..dag import Dag, NewNode
from .summarize import SourceItem, Summarizer, attempt_problems, extract_topics

FOOTER_MARK = "\n\n[expand: trove_expand(node_id="
MIN_FOLD_TOKENS = 200   # an overview smaller than this says too little to be worth a fold


@dataclass
class PassReport:
    """What one compaction pass did, for status and the no-op reasons."""

    leaf_ids: list[int] = field(default_factory=list)
    condensed_ids: list[int] = field(default_factory=list)
    summarizer_calls: int = 0
    levels: list[int] = field(default_factory=list)
    summary_problems: dict = field(default_factory=dict)  # model attempt outcome -> count
    seconds: float = 0.0
    prepared_used: int = 0   # nodes written from background-prepared summaries
    sweep: dict | None = None  # the full sweep's bounds and use, when it ran


def footer_text(node_id: int, coverage: dict) -> str:
    """The closing line of every summary: its handle, coverage and topics."""
    span = ""
    if coverage.get("first_store_id") is not None:
        span = f" · messages m{coverage['first_store_id']}–m{coverage['last_store_id']}"
    topics = ", ".join(coverage.get("topics") or [])
    return (f"{FOOTER_MARK}{node_id}) · depth {coverage['depth']}"
            f" · {coverage['message_count']} messages{span}"
            + (f" · topics: {topics}" if topics else "") + "]")


def summary_body(text: str) -> str:
    """A node's text without its footer (what a higher level summarizes)."""
    cut = text.rfind(FOOTER_MARK)
    return text[:cut] if cut >= 0 else text


def message_item(store_id: int, message: dict, when: float | None) -> SourceItem:
    """A raw message as summarizer input."""
    return SourceItem(ref=f"m{store_id}", role=str(message.get("role") or "unknown"),
                      text=codec.message_text(message), tool_name=codec.tool_name_of(message),
                      time=when)


def node_item(node: dict) -> SourceItem:
    """A lower-level summary as summarizer input."""
    return SourceItem(ref=f"n{node['node_id']}", role="summary",
                      text=summary_body(node["text"]), time=node.get("time_to"))


def chunk_by_tokens(sizes: Sequence[int], chunk_tokens: int) -> list[range]:
    """Consecutive index ranges whose sizes add up to at most ``chunk_tokens``
    (a single oversized item gets a range of its own)."""
    chunks: list[range] = []
    start, total = 0, 0
    for i, size in enumerate(sizes):
        if i > start and total + size > chunk_tokens:
            chunks.append(range(start, i))
            start, total = i, 0
        total += size
    if start < len(sizes):
        chunks.append(range(start, len(sizes)))
    return chunks


class Compactor:
    """Writes leaf and condensed nodes for one database."""

    def __init__(self, dag: Dag, summarizer: Summarizer, count_text: Callable[[str], int], *,
                 leaf_budget: int, condensed_budget: int):
        self.dag = dag
        self.summarizer = summarizer
        self.count_text = count_text
        self.leaf_budget = leaf_budget
        self.condensed_budget = condensed_budget

    def leaf_pass(self, session_id: str, rows: Sequence[tuple[int, dict, float | None, int]], *,
                  chunk_tokens: int, focus: str | None, deterministic_only: bool,
                  report: PassReport) -> None:
        """Summarize ``(store_id, message, time, tokens)`` rows, oldest first, into leaves."""
        started = time.perf_counter()
        for chunk in chunk_by_tokens([r[3] for r in rows], chunk_tokens):
            part = [rows[i] for i in chunk]
            items = [message_item(sid, msg, when) for sid, msg, when, _ in part]
            node_id = self._summarize_into_node(
                session_id, items, depth=0, budget=self.leaf_budget,
                source_tokens=sum(r[3] for r in part), focus=focus,
                deterministic_only=deterministic_only, report=report,
                child_store_ids=[r[0] for r in part])
            report.leaf_ids.append(node_id)
        report.seconds += time.perf_counter() - started

    def write_prepared_leaf(self, session_id: str,
                            rows: Sequence[tuple[int, dict, float | None, int]],
                            summary: dict, report: PassReport) -> int:
        """A leaf over ``rows`` from a summary prepared in the background
        (``compaction.prepare``): the same node a leaf pass would write, no call."""
        node_id = self.dag.add_node(NewNode(
            session_id=session_id, depth=0, text=summary.get("text") or "(no text)",
            token_count=int(summary.get("tokens") or 0),
            source_token_count=sum(r[3] for r in rows), level=int(summary.get("level") or 3),
            model=str(summary.get("model") or ""), child_store_ids=[r[0] for r in rows],
            child_node_ids=[], topics=list(summary.get("topics") or [])), footer=footer_text)
        report.leaf_ids.append(node_id)
        report.levels.append(int(summary.get("level") or 3))
        report.prepared_used += 1
        return node_id

    def condense(self, session_id: str, *, fanout: int, max_depth: int, focus: str | None,
                 deterministic_only: bool, report: PassReport,
                 ready: Mapping[str, dict] | None = None) -> list[str]:
        """Merge the oldest ``fanout`` parentless nodes of a depth into one node a level
        up, level by level, while some depth below ``max_depth`` has that many.

        ``ready`` holds group summaries prepared in the background by
        ``group_key``: a group whose key is there is written from it without a
        call (never with a focus topic, which they were made without). Returns
        the keys used."""
        started = time.perf_counter()
        used: list[str] = []
        while True:
            group = oldest_full_group(self.dag.frontier(session_id), fanout, max_depth)
            if group is None:
                break
            key = group_key(group) if ready and focus is None else None
            summary = ready.get(key) if key is not None else None
            if summary is not None and summary.get("depth") == max(n["depth"] for n in group) + 1:
                self._write_prepared_merge(session_id, group, summary, report)
                used.append(key)
                continue
            self._merge(session_id, group, budget=self.condensed_budget, focus=focus,
                        deterministic_only=deterministic_only, report=report)
        report.seconds += time.perf_counter() - started
        return used

    def _write_prepared_merge(self, session_id: str, group: Sequence[dict], summary: dict,
                              report: PassReport) -> int:
        """A condensed node over ``group`` from a summary prepared in the background:
        the node ``_merge`` would write, without the call."""
        node_id = self.dag.add_node(NewNode(
            session_id=session_id, depth=max(n["depth"] for n in group) + 1,
            text=summary.get("text") or "(no text)", token_count=int(summary.get("tokens") or 0),
            source_token_count=sum(self.count_text(summary_body(n["text"])) for n in group),
            level=int(summary.get("level") or 3), model=str(summary.get("model") or ""),
            child_store_ids=[], child_node_ids=[n["node_id"] for n in group],
            topics=list(summary.get("topics") or [])), footer=footer_text)
        report.condensed_ids.append(node_id)
        report.levels.append(int(summary.get("level") or 3))
        report.prepared_used += 1
        return node_id

    def fold_to_fit(self, session_id: str, *, budget_tokens: int, cost: Callable[[dict], int],
                    max_source_tokens: int, focus: str | None, deterministic_only: bool,
                    report: PassReport) -> int | None:
        """Keep the whole frontier inside the summary block: when its nodes cost more
        than ``budget_tokens``, merge the oldest ones (any depths) into one overview.

        Condensation stops at ``TROVE_INCREMENTAL_MAX_DEPTH``, so over a long session
        the frontier keeps growing and the block would have to leave its oldest nodes
        out of the prompt. Folding them instead keeps every part of the conversation
        in the prompt, the oldest at the coarsest level, and reachable by lineage. The
        newest nodes kept beside the overview use at most half of the room left, so
        the next fold (a change at the start of the prompt) waits for several
        compactions. One fold reads at most ``max_source_tokens`` (but at least two
        nodes), like a leaf reads its chunk: a long frontier (an upgraded database, a
        small window) is folded over several passes, never in one huge call.
        Returns the new node's id, or None when nothing was folded.
        """
        frontier = self.dag.frontier(session_id)
        costs = [cost(n) for n in frontier]
        overview = min(self.condensed_budget, budget_tokens // 2)
        if sum(costs) <= budget_tokens or len(frontier) < 2 or overview < MIN_FOLD_TOKENS:
            return None
        room, kept, used = (budget_tokens - overview) // 2, 0, 0
        for node_cost in reversed(costs):  # newest first
            if used + node_cost > room:
                break
            used, kept = used + node_cost, kept + 1
        take, source = 0, 0
        while take < max(2, len(frontier) - kept) and (
                take < 2 or source + costs[take] <= max_source_tokens):
            source, take = source + costs[take], take + 1
        group = frontier[:take]
        started = time.perf_counter()
        node_id = self._merge(session_id, group, budget=overview, focus=focus,
                              deterministic_only=deterministic_only, report=report)
        report.seconds += time.perf_counter() - started
        return node_id

    def _merge(self, session_id: str, group: Sequence[dict], *, budget: int, focus: str | None,
               deterministic_only: bool, report: PassReport) -> int:
        """One condensed node over ``group`` (oldest first), one level above its deepest."""
        items = [node_item(n) for n in group]
        node_id = self._summarize_into_node(
            session_id, items, depth=max(n["depth"] for n in group) + 1, budget=budget,
            source_tokens=sum(self.count_text(i.text) for i in items), focus=focus,
            deterministic_only=deterministic_only, report=report,
            child_node_ids=[n["node_id"] for n in group])
        report.condensed_ids.append(node_id)
        return node_id

    def _summarize_into_node(self, session_id: str, items: list[SourceItem], *, depth: int,
                             budget: int, source_tokens: int, focus: str | None,
                             deterministic_only: bool, report: PassReport,
                             child_store_ids: Sequence[int] = (),
                             child_node_ids: Sequence[int] = ()) -> int:
        """Summarize ``items`` and write the node with its children; return its id."""
        result = self.summarizer.summarize(items, budget_tokens=budget, depth=depth,
                                           focus=focus, deterministic_only=deterministic_only)
        report.summarizer_calls += sum(1 for a in result.attempts if a[0] in (1, 2)
                                       and not str(a[2]).startswith("skipped"))
        report.levels.append(result.level)
        for outcome, n in attempt_problems(result.attempts).items():
            report.summary_problems[outcome] = report.summary_problems.get(outcome, 0) + n
        return self.dag.add_node(NewNode(
            session_id=session_id, depth=depth, text=result.text or "(no text)",
            token_count=result.tokens, source_token_count=source_tokens, level=result.level,
            model=result.model, child_store_ids=list(child_store_ids),
            child_node_ids=list(child_node_ids),
            topics=extract_topics([i.text for i in items], limit=6)), footer=footer_text)


def group_key(group: Sequence[dict]) -> str:
    """The key of a group of summaries to merge: their coverage and texts without
    footers (what the merge reads), so a prepared merge matches the exact input."""
    return prepared.group_key((n.get("first_store_id"), n.get("last_store_id"),
                               summary_body(n["text"])) for n in group)


def oldest_full_group(frontier: list[dict], fanout: int, max_depth: int) -> list[dict] | None:
    """The oldest ``fanout`` frontier nodes of the lowest depth that has that many: the
    group ``Compactor.condense`` merges next (the background preparer predicts it)."""
    by_depth: dict[int, list[dict]] = {}
    for node in frontier:
        by_depth.setdefault(node["depth"], []).append(node)
    for depth in sorted(by_depth):
        if depth >= max_depth:
            continue
        nodes = sorted(by_depth[depth], key=lambda n: (n.get("first_store_id") or 0, n["node_id"]))
        if len(nodes) >= fanout:
            return nodes[:fanout]
    return None
