"""A self-contained HTML view of one session's summary DAG.

One file, no network: the nodes and a preview of each node's sources are
embedded as JSON, a few lines of JavaScript lay them out by depth, and clicking
a node shows its summary and its sources (child summaries, or raw messages).
Used by the demo and by ``scripts/trove.py dag``.
"""

from __future__ import annotations

import html
import re
import time
from pathlib import Path

from ..storage import codec
from ..dag import Dag
from ..store import Store, decode_row

PREVIEW_CHARS = 600
MAX_SOURCES_SHOWN = 60
TAIL_SHOWN = 200  # raw messages after the newest summary, shown as the fresh tail


def _iso(ts) -> str | None:
    """A Unix time as ISO-8601 UTC (minutes), for the page."""
    return time.strftime("%Y-%m-%d %H:%M", time.gmtime(float(ts))) + "Z" if ts else None


def _sources(store: Store, dag: Dag, children: list[dict]) -> list[dict]:
    """Previews of the first ``MAX_SOURCES_SHOWN`` children (messages or summaries)."""
    shown = children[:MAX_SOURCES_SHOWN]
    rows = store.get_messages(c["id"] for c in shown if c["kind"] == "message")
    kids = dag.get_nodes(c["id"] for c in shown if c["kind"] == "node")
    sources = []
    for child in shown:
        if child["kind"] == "message" and child["id"] in rows:
            message = decode_row(rows[child["id"]])
            sources.append({"ref": f"m{child['id']}", "role": message.get("role"),
                            "text": codec.message_text(message)[:PREVIEW_CHARS]})
        elif child["kind"] == "node" and child["id"] in kids:
            sources.append({"ref": f"n{child['id']}", "role": "summary",
                            "text": kids[child["id"]]["text"][:PREVIEW_CHARS]})
    return sources


def _fresh_tail(store: Store, after_store_id: int, session_id: str) -> dict:
    """The raw messages no summary covers yet (after the newest summarized one)."""
    rows = store.session_messages(session_id, after_store_id, TAIL_SHOWN + 1)
    items = []
    for row in rows[:TAIL_SHOWN]:
        message = decode_row(row)
        items.append({"ref": f"m{row['store_id']}", "role": message.get("role"),
                      "time": _iso(row["message_at"] or row["created_at"]),
                      "text": codec.message_text(message)[:PREVIEW_CHARS]})
    return {"messages": items, "cut": len(rows) > TAIL_SHOWN}


def _span(store: Store, session_id: str, node: dict) -> list[int] | None:
    """The node's first and last message as places in this session (#1 = its first
    message), since store ids are shared by every session of the database."""
    if node["first_store_id"] is None or node["last_store_id"] is None:
        return None
    return [store.position_in_session(session_id, node["first_store_id"]),
            store.position_in_session(session_id, node["last_store_id"])]


def dag_data(store: Store, dag: Dag, session_id: str) -> dict:
    """Nodes of a session with their sources, the parent-to-child edges among them, and
    the raw fresh tail, ready for the page."""
    nodes = dag.session_nodes(session_id)
    frontier = {n["node_id"] for n in dag.frontier(session_id)}
    ids = {n["node_id"] for n in nodes}
    items, edges = [], []
    for node in nodes:
        children = dag.children(node["node_id"])
        edges += [[node["node_id"], c["id"]] for c in children
                  if c["kind"] == "node" and c["id"] in ids]
        items.append({"id": node["node_id"], "depth": node["depth"], "text": node["text"],
                      "tokens": node["token_count"], "messages": node["message_count"],
                      "first": node["first_store_id"], "last": node["last_store_id"],
                      "span": _span(store, session_id, node),
                      "from": _iso(node["time_from"]), "to": _iso(node["time_to"]),
                      "level": node["level"], "model": node["model"],
                      "live": node["node_id"] in frontier, "children": len(children),
                      "sources": _sources(store, dag, children)})
    covered = max((n["last_store_id"] or 0 for n in nodes), default=0)
    return {"session": session_id, "nodes": items, "edges": edges,
            "tail": _fresh_tail(store, covered, session_id),
            "max_sources": MAX_SOURCES_SHOWN}


PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<title>trove DAG · __TITLE__</title>
<style>
body { font: 14px/1.4 system-ui, sans-serif; margin: 0; display: flex; height: 100vh; }
#dag { flex: 3; overflow: auto; padding: 12px; border-right: 1px solid #ddd; }
#detail { flex: 2; overflow: auto; padding: 12px; white-space: pre-wrap; }
#graph { position: relative; }
#edges { position: absolute; left: 0; top: 0; pointer-events: none; overflow: visible; }
#edges line { stroke: #99a; stroke-width: 1.2; }
#edges line.hot { stroke: #f80; stroke-width: 2.5; }
.row { margin-bottom: 28px; position: relative; z-index: 1; }
.row h3 { margin: 4px 0; font-size: 13px; color: #555; }
.node, .msg { display: inline-block; margin: 3px; padding: 5px 7px; border: 1px solid #667;
        border-radius: 6px; cursor: pointer; font-size: 12px; }
.node.live { border-width: 3px; border-color: #1a7f37; }
.node.selected, .msg.selected { outline: 3px solid #f80; }
.msg { background: #fff; border-style: dashed; }
.dim { opacity: 0.15; }
#legend span { display: inline-block; margin-right: 10px; font-size: 12px; }
#legend i { display: inline-block; width: 12px; height: 12px; border-radius: 3px;
            vertical-align: middle; margin-right: 3px; border: 1px solid #667; }
#search { width: 50%; padding: 4px; margin: 6px 0; }
.src { border-top: 1px solid #eee; padding: 6px 0; } .ref { font-weight: 600; color: #336; }
.cut { color: #a40; font-style: italic; } a.ref-link { color: #06c; cursor: pointer; }
</style></head>
<body><div id="dag"><h2>Session __TITLE__</h2>
<p><span id="count">__COUNT__ summary nodes</span> · thick green border = in the live prompt ·
lines run from parent to child · click a node</p>
<div id="legend"></div>
<input id="search" type="search" placeholder="filter nodes by text">
<span id="matches"></span>
<div id="graph"><svg id="edges"></svg><div id="rows"></div></div></div>
<div id="detail">Select a node to see its summary and sources.</div>
<script id="data" type="application/json">__DATA__</script>
<script>
const data = JSON.parse(document.getElementById('data').textContent);
const PALETTE = ['#dbeafe', '#dcfce7', '#fef9c3', '#fde2e2', '#ede9fe', '#cffafe', '#ffe4c7'];
const colour = d => PALETTE[d % PALETTE.length];
const byId = new Map(data.nodes.map(n => [n.id, n]));
const tailById = new Map(data.tail.messages.map(m => [m.ref, m]));
const rows = document.getElementById('rows');
const depths = [...new Set(data.nodes.map(n => n.depth))].sort((a, b) => b - a);
const legend = document.getElementById('legend');
for (const d of [...depths].reverse()) {
  const item = document.createElement('span');
  const swatch = document.createElement('i'); swatch.style.background = colour(d);
  item.append(swatch, 'depth ' + d + (d === 0 ? ' (over raw messages)' : ''));
  legend.appendChild(item);
}
const tailKey = document.createElement('span');
const tailSwatch = document.createElement('i'); tailSwatch.style.background = '#fff';
tailSwatch.style.borderStyle = 'dashed'; tailKey.append(tailSwatch, 'raw fresh tail');
legend.appendChild(tailKey);
const elements = new Map();
for (const d of depths) {
  const row = document.createElement('div'); row.className = 'row';
  row.innerHTML = '<h3>depth ' + d + '</h3>';
  for (const n of data.nodes.filter(x => x.depth === d)) {
    const el = document.createElement('span');
    el.className = 'node' + (n.live ? ' live' : ''); el.dataset.nodeId = n.id;
    el.style.background = colour(n.depth);
    el.title = (n.from || '') + ' – ' + (n.to || '') + ' · store ids m' + n.first + '–m' + n.last;
    el.textContent = 'n' + n.id + ' · ' + n.tokens + ' tok · ' + n.messages + ' msgs' +
      (n.span ? ' · #' + n.span[0] + '–#' + n.span[1] : '');
    el.onclick = () => show(n.id); row.appendChild(el); elements.set(n.id, el);
  }
  rows.appendChild(row);
}
const tailRow = document.createElement('div'); tailRow.className = 'row';
tailRow.innerHTML = '<h3>raw fresh tail: ' + data.tail.messages.length +
  (data.tail.cut ? '+ (first shown)' : '') + ' messages not summarized yet</h3>';
for (const m of data.tail.messages) {
  const el = document.createElement('span'); el.className = 'msg'; el.dataset.ref = m.ref;
  el.textContent = m.ref + ' ' + m.role; el.title = m.time || '';
  el.onclick = () => showMessage(m, el); tailRow.appendChild(el);
}
rows.appendChild(tailRow);
const svg = document.getElementById('edges');
function drawEdges() {
  const box = document.getElementById('graph').getBoundingClientRect();
  svg.setAttribute('width', box.width); svg.setAttribute('height', box.height);
  svg.textContent = '';
  for (const [parent, child] of data.edges) {
    const a = elements.get(parent).getBoundingClientRect();
    const b = elements.get(child).getBoundingClientRect();
    const line = document.createElementNS('http://www.w3.org/2000/svg', 'line');
    line.setAttribute('class', 'edge'); line.dataset.parent = parent; line.dataset.child = child;
    line.setAttribute('x1', a.left + a.width / 2 - box.left);
    line.setAttribute('y1', a.bottom - box.top);
    line.setAttribute('x2', b.left + b.width / 2 - box.left);
    line.setAttribute('y2', b.top - box.top);
    svg.appendChild(line);
  }
}
drawEdges(); window.addEventListener('resize', drawEdges);
function linked(text) {
  const out = document.createDocumentFragment(); let last = 0;
  for (const m of text.matchAll(/\\b([nm])(\\d+)\\b/g)) {
    const known = m[1] === 'n' ? byId.has(Number(m[2])) : tailById.has(m[0]);
    if (!known) continue;
    out.append(text.slice(last, m.index));
    const a = document.createElement('a'); a.className = 'ref-link'; a.textContent = m[0];
    a.href = '#' + m[0];
    a.onclick = (e) => { e.preventDefault(); m[1] === 'n' ? show(Number(m[2]))
      : showMessage(tailById.get(m[0]), document.querySelector('[data-ref="' + m[0] + '"]')); };
    out.append(a); last = m.index + m[0].length;
  }
  out.append(text.slice(last)); return out;
}
function select(el) {
  document.querySelectorAll('.selected').forEach(x => x.classList.remove('selected'));
  if (el) { el.classList.add('selected'); el.scrollIntoView({block: 'nearest'}); }
}
function show(id) {
  const n = byId.get(id); if (!n) return;
  select(elements.get(id)); location.hash = 'n' + id;
  svg.querySelectorAll('line').forEach(l => l.classList.toggle('hot',
    l.dataset.parent == id || l.dataset.child == id));
  const box = document.getElementById('detail'); box.textContent = '';
  const head = document.createElement('h3');
  head.textContent = 'n' + n.id + ' · depth ' + n.depth + ' · ' + n.messages +
    ' messages · ' + (n.from || '?') + ' – ' + (n.to || '?') + ' · level ' + n.level +
    ' (' + n.model + ')';
  const body = document.createElement('div'); body.appendChild(linked(n.text));
  const src = document.createElement('h4'); src.textContent = 'Sources (' + n.children + ')';
  box.append(head, body, src);
  if (n.children > n.sources.length) {
    const cut = document.createElement('div'); cut.className = 'cut';
    cut.textContent = 'showing the first ' + n.sources.length + ' of ' + n.children +
      ' sources; the rest: trove.py expand n' + n.id + ' --offset ' + n.sources.length;
    box.appendChild(cut);
  }
  for (const s of n.sources) {
    const div = document.createElement('div'); div.className = 'src';
    const ref = document.createElement('span'); ref.className = 'ref';
    ref.appendChild(linked(s.ref)); ref.append(' ' + s.role + ': ');
    div.append(ref, linked(s.text)); box.appendChild(div);
  }
}
function showMessage(m, el) {
  select(el);
  const box = document.getElementById('detail'); box.textContent = '';
  const head = document.createElement('h3');
  head.textContent = m.ref + ' · ' + m.role + ' · ' + (m.time || '') + ' (raw, not summarized)';
  const body = document.createElement('div'); body.appendChild(linked(m.text));
  box.append(head, body);
}
const search = document.getElementById('search');
search.oninput = () => {
  const q = search.value.trim().toLowerCase(); let hits = 0;
  for (const n of data.nodes) {
    const hit = !q || n.text.toLowerCase().includes(q) || ('n' + n.id) === q ||
      n.sources.some(s => s.text.toLowerCase().includes(q));
    elements.get(n.id).classList.toggle('dim', !hit); hits += hit ? 1 : 0;
  }
  for (const el of tailRow.querySelectorAll('.msg')) {
    const m = tailById.get(el.dataset.ref);
    el.classList.toggle('dim', !!q && !m.text.toLowerCase().includes(q));
  }
  document.getElementById('matches').textContent = q ? hits + ' of ' + data.nodes.length +
    ' nodes match' : '';
};
const asked = new URLSearchParams(location.search).get('q');  // page.html?q=words
if (asked) { search.value = asked; search.oninput(); }
if (location.hash.startsWith('#n')) show(Number(location.hash.slice(2)));
</script></body></html>
"""


def render_html(data: dict) -> str:
    """The page for ``dag_data`` output (data embedded safely inside a script tag; one
    substitution pass, so text in the data is never taken for a placeholder)."""
    values = {"TITLE": html.escape(str(data["session"])), "COUNT": str(len(data["nodes"])),
              "DATA": codec.dump_json(data).replace("</", "<\\/")}
    return re.sub(r"__(TITLE|COUNT|DATA)__", lambda m: values[m.group(1)], PAGE)


def write_dag_html(store: Store, dag: Dag, session_id: str, path: str | Path) -> Path:
    """Write the DAG view of ``session_id`` to ``path``; return the path."""
    target = Path(path)
    target.write_text(render_html(dag_data(store, dag, session_id)), encoding="utf-8")
    return target
