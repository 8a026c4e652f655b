#!/usr/bin/env python3
"""Tokens trove adds to one request the host sends, for three configurations.

    .venv/bin/python bench/request_overhead.py [--per-tool]

What is counted, each exactly as it goes on the wire:
- the trove_* tool schemas: the ``tools`` entries the host appends (each schema wrapped
  as ``{"type": "function", "function": ...}``), serialized as the openai client does
  (``schemas.wire_json``); they are in every request;
- the recall policy the ``pre_llm_call`` hook appends to the user turn
  (``policy_for_turn``): once per prompt, on the first turn that is shown without it
  (the host sends each turn's injected text again with that turn, so later turns add 0);
- the summary block: its header (once, in a compacted prompt), the label and expand
  footer around each summary (per summary; a footer's topics add their own words, here
  three), and the assistant acknowledgement that follows the block when the tail starts
  with a user turn.

Configurations: ``defaults`` (no setting); ``all families on`` (TROVE_ASSERTIONS_ENABLED
and TROVE_RETRIEVE_ENABLED); ``minimal`` (TROVE_EXPOSED_TOOLS=trove_grep,trove_expand,
trove_recall: the three tools the policy names). Counts in cl100k_base (the engine's
counter), and in o200k_base when an o200k encoding loads offline (tiktoken's own only
when its rank file is cached; else rs-bpe's table, which is not checked against
tiktoken here and is labelled so).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
from _bootstrap import load_package  # noqa: E402

trove = load_package()
from hermes_trove import schemas  # noqa: E402
from hermes_trove.compaction import assemble, compactor, tokens  # noqa: E402
from hermes_trove.config import load_config  # noqa: E402

CONFIGS = (
    ("defaults", {}),
    ("all families on", {"TROVE_ASSERTIONS_ENABLED": "true", "TROVE_RETRIEVE_ENABLED": "true"}),
    ("minimal", {"TROVE_EXPOSED_TOOLS": "trove_grep,trove_expand,trove_recall"}),
)
# A typical node as the block shows it: its heading, and the footer its text ends with.
SAMPLE_NODE = {"node_id": 1234, "depth": 1}
SAMPLE_COVERAGE = {"depth": 1, "message_count": 48, "first_store_id": 10211,
                   "last_store_id": 10258, "topics": ["retry_backoff_ms", "staging", "pgbouncer"]}


def counters() -> list[tuple[str, object]]:
    """(column name, count function): cl100k always; o200k when one loads offline."""
    cl100k = tokens.get_counter("cl100k_base")
    found = [(f"cl100k ({cl100k.name})", cl100k.count_text)]
    o200k = tokens.get_counter("o200k_base", accelerate=False)
    if o200k.exact and "o200k" in o200k.name:
        found.append((f"o200k ({o200k.name})", o200k.count_text))
        return found
    try:
        from rs_bpe.bpe import openai
        found.append(("o200k (rs-bpe table, not checked against tiktoken)",
                      openai.o200k_base().count))
    except Exception as exc:  # noqa: BLE001 - the column is simply left out
        print(f"o200k_base: not available offline ({type(exc).__name__}); cl100k only")
    return found


def parts(env: dict, home: Path) -> dict[str, str]:
    """The texts one request carries from trove under the settings in ``env``."""
    cfg = load_config(environ=env, hermes_home=home)
    assert not cfg.warnings, cfg.warnings
    exposed = schemas.get_tool_schemas(cfg)
    label = assemble.node_section({**SAMPLE_NODE, "text": ""}) + compactor.footer_text(
        SAMPLE_NODE["node_id"], SAMPLE_COVERAGE)
    return {"tools": str(len(exposed)), "schemas": schemas.wire_json(exposed),
            "policy": trove.policy_for_turn(cfg, "normal", []),
            "block header": assemble.BLOCK_HEADER, "per summary": label,
            "ack": assemble.ACK_TEXT}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--per-tool", action="store_true", help="also list each schema")
    args = parser.parse_args()
    columns = counters()
    with tempfile.TemporaryDirectory() as home:
        rows = [(name, parts(env, Path(home))) for name, env in CONFIGS]
    keys = ("schemas", "policy", "block header", "per summary", "ack")
    for column, count in columns:
        print(f"\n{column}")
        print("| configuration | tools | " + " | ".join(keys) + " | first request |")
        print("| --- " * (len(keys) + 3) + "|")
        for name, texts in rows:
            figures = [count(texts[k]) if texts[k] else 0 for k in keys]
            print(f"| {name} | {texts['tools']} | " + " | ".join(f"{f:,}" for f in figures)
                  + f" | {figures[0] + figures[1]:,} |")
    if args.per_tool:
        count = columns[0][1]
        print(f"\nper tool, {columns[0][0]}, JSON as sent:")
        for schema in schemas.get_tool_schemas():
            print(f"  {schema['name']:24} {count(schemas.wire_json([schema])):5,}")


if __name__ == "__main__":
    main()
