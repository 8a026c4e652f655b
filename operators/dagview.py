"""A self-contained HTML view of one session's summary DAG.

One file, no network: the nodes and a preview of each node's sources are
embedded as JSON, a few lines of JavaScript lay them out by depth, and clicking
a node shows its summary and its sources (child summaries, or raw messages).
Used by the demo and by ``scripts/trove.py dag``.
"""

from __future__ import annotations

import html
from pathlib import Path

from ..storage import codec
from ..dag import Dag
from ..store import Store, decode_row

PREVIEW_CHARS = 600
MAX_SOURCES_SHOWN = 60


def dag_data(store: Store, dag: Dag, session_id: str) -> dict:
    """Nodes of a session with their children previews, ready for the page."""
    nodes = dag.session_nodes(session_id)
    frontier = {n["node_id"] for n in dag.frontier(session_id)}
    items = []
    for node in nodes:
        children = dag.children(node["node_id"], limit=MAX_SOURCES_SHOWN)
        rows = store.get_messages(c["id"] for c in children if c["kind"] == "message")
        kids = dag.get_nodes(c["id"] for c in children if c["kind"] == "node")
        sources = []
        for child in children:
            if child["kind"] == "message" and child["id"] in rows:
                message = decode_row(rows[child["id"]])
                sources.append({"ref": f"m{child['id']}", "role": message.get("role"),
                                "text": codec.message_text(message)[:PREVIEW_CHARS]})
            elif child["kind"] == "node" and child["id"] in kids:
                sources.append({"ref": f"n{child['id']}", "role": "summary",
                                "text": kids[child["id"]]["text"][:PREVIEW_CHARS]})
        items.append({"id": node["node_id"], "depth": node["depth"], "text": node["text"],
                      "tokens": node["token_count"], "messages": node["message_count"],
                      "first": node["first_store_id"], "last": node["last_store_id"],
                      "level": node["level"], "model": node["model"],
                      "live": node["node_id"] in frontier,
                      "children": dag.child_count(node["node_id"]), "sources": sources})
    return {"session": session_id, "nodes": items}


PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<title>trove DAG · {title}</title>
<style>
body {{ font: 14px/1.4 system-ui, sans-serif; margin: 0; display: flex; height: 100vh; }}
#dag {{ flex: 1; overflow: auto; padding: 12px; border-right: 1px solid #ddd; }}
#detail {{ flex: 1; overflow: auto; padding: 12px; white-space: pre-wrap; }}
.row {{ margin-bottom: 14px; }} .row h3 {{ margin: 4px 0; font-size: 13px; color: #555; }}
.node {{ display: inline-block; margin: 3px; padding: 6px 8px; border: 1px solid #88a;
        border-radius: 6px; cursor: pointer; background: #f4f6ff; }}
.node.live {{ border-color: #2a7; background: #eefaf2; }}
.node.selected {{ outline: 2px solid #f80; }}
.src {{ border-top: 1px solid #eee; padding: 6px 0; }} .ref {{ font-weight: 600; color: #336; }}
</style></head>
<body><div id="dag"><h2>Session {title}</h2>
<p>{count} summary nodes · green = in the live prompt · click a node</p><div id="rows"></div></div>
<div id="detail">Select a node to see its summary and sources.</div>
<script id="data" type="application/json">{data}</script>
<script>
const data = JSON.parse(document.getElementById('data').textContent);
const rows = document.getElementById('rows');
const depths = [...new Set(data.nodes.map(n => n.depth))].sort((a, b) => b - a);
for (const d of depths) {{
  const row = document.createElement('div'); row.className = 'row';
  row.innerHTML = '<h3>depth ' + d + (d === 0 ? ' (leaves over raw messages)' : '') + '</h3>';
  for (const n of data.nodes.filter(x => x.depth === d)) {{
    const el = document.createElement('span');
    el.className = 'node' + (n.live ? ' live' : ''); el.dataset.nodeId = n.id;
    el.textContent = 'n' + n.id + ' · ' + n.tokens + ' tok · m' + n.first + '–m' + n.last;
    el.onclick = () => show(n, el); row.appendChild(el);
  }}
  rows.appendChild(row);
}}
function show(n, el) {{
  document.querySelectorAll('.node.selected').forEach(x => x.classList.remove('selected'));
  el.classList.add('selected');
  const box = document.getElementById('detail'); box.textContent = '';
  const head = document.createElement('h3');
  head.textContent = 'node ' + n.id + ' · depth ' + n.depth + ' · ' + n.messages +
    ' messages · level ' + n.level + ' (' + n.model + ')';
  const body = document.createElement('div'); body.textContent = n.text;
  const src = document.createElement('h4');
  src.textContent = 'Sources (' + n.children + ')';
  box.append(head, body, src);
  for (const s of n.sources) {{
    const div = document.createElement('div'); div.className = 'src';
    const ref = document.createElement('span'); ref.className = 'ref';
    ref.textContent = s.ref + ' ' + s.role + ': ';
    div.append(ref, document.createTextNode(s.text)); box.appendChild(div);
  }}
}}
</script></body></html>
"""


def render_html(data: dict) -> str:
    """The page for ``dag_data`` output (data embedded safely inside a script tag)."""
    payload = codec.dump_json(data).replace("</", "<\\/")
    return PAGE.format(title=html.escape(str(data["session"])), count=len(data["nodes"]),
                       data=payload)


def write_dag_html(store: Store, dag: Dag, session_id: str, path: str | Path) -> Path:
    """Write the DAG view of ``session_id`` to ``path``; return the path."""
    target = Path(path)
    target.write_text(render_html(dag_data(store, dag, session_id)), encoding="utf-8")
    return target
