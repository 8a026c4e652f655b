"""The probe plugin: a tiny recording context engine named "trove".

Written into a temporary folder by tests that need to see exactly how the real
host calls an engine (call order, arguments, deep copies) without the
repository's own plugin. Used through ``hostkit``.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Union

# ---------------------------------------------------------------------------
# Probe plugin: a tiny recording context engine named "trove"
# ---------------------------------------------------------------------------

_PROBE_MANIFEST = """\
name: {name}
version: 0.0.1
description: hostkit probe context engine (records every host call)
author: hostkit
kind: standalone
manifest_version: 1
provides_tools:
  - probe_echo
provides_hooks:
  - pre_llm_call
  - post_llm_call
  - on_session_end
"""

_PROBE_SKILL = """\
---
name: probe-skill
description: hostkit probe skill
---
# probe skill
"""

_PROBE_INIT = '''\
"""hostkit probe: a context engine named "trove" that records what the host calls.

Everything is recorded in module-level lists (shared by all deep copies):
CALLS (engine methods), HOOKS (plugin hooks + slash command). Optional
$HERMES_HOME/probe.json: {"threshold_tokens": int, "compress_once": bool}.
"""
import copy
import json
import os
import threading
import time
from pathlib import Path

from agent.context_engine import ContextEngine

CALLS = []
HOOKS = []
ENGINES = []
REGISTER_INFO = {}
PROBE_CONTEXT = "PROBE-CONTEXT-INJECTED"
_LOCK = threading.Lock()


def _rec(engine, method, **info):
    with _LOCK:
        CALLS.append(dict(method=method, engine=id(engine), t=time.time(), **info))


def calls(method=None):
    return [c for c in CALLS if method is None or c["method"] == method]


def _settings():
    try:
        home = os.environ.get("HERMES_HOME", "")
        return json.loads((Path(home) / "probe.json").read_text())
    except Exception:
        return {}


class ProbeEngine(ContextEngine):
    def __init__(self):
        self.threshold_tokens = 10 ** 9
        self.context_length = 0
        self.compression_count = 0
        self.last_prompt_tokens = 0
        self.last_completion_tokens = 0
        self.last_total_tokens = 0
        self.protect_first_n = 0
        self.protect_last_n = 2
        self.session_id = None
        self.compress_once = False
        self.is_template = True
        ENGINES.append(self)
        _rec(self, "__init__")

    def __deepcopy__(self, memo):
        new = type(self).__new__(type(self))
        new.__dict__.update(copy.deepcopy(self.__dict__, memo))
        new.is_template = False
        ENGINES.append(new)
        _rec(new, "__deepcopy__", source=id(self))
        return new

    @property
    def name(self):
        return "trove"

    def update_model(self, model, context_length, base_url="", api_key="", provider="", api_mode=""):
        _rec(self, "update_model", model=model, context_length=context_length, base_url=base_url,
             api_key_is_callable=callable(api_key), provider=provider, api_mode=api_mode)
        self.context_length = context_length
        cfg = _settings()
        self.threshold_tokens = int(cfg.get("threshold_tokens") or context_length * 0.75)
        self.compress_once = bool(cfg.get("compress_once", False))

    def on_session_start(self, session_id, **kw):
        _rec(self, "on_session_start", session_id=session_id, kw=dict(kw))
        self.session_id = session_id

    def on_session_end(self, session_id, messages):
        _rec(self, "on_session_end", session_id=session_id, n_messages=len(messages or []))

    def on_session_reset(self):
        _rec(self, "on_session_reset")

    def update_from_response(self, usage):
        _rec(self, "update_from_response", usage=dict(usage or {}))
        usage = usage or {}
        self.last_prompt_tokens = usage.get("prompt_tokens", 0) or 0
        self.last_completion_tokens = usage.get("completion_tokens", 0) or 0
        self.last_total_tokens = usage.get("total_tokens", 0) or 0

    def should_compress(self, prompt_tokens=None):
        result = bool(prompt_tokens is not None and prompt_tokens >= self.threshold_tokens)
        _rec(self, "should_compress", prompt_tokens=prompt_tokens, threshold=self.threshold_tokens, result=result)
        return result

    def has_content_to_compress(self, messages):
        _rec(self, "has_content_to_compress", n_messages=len(messages or []))
        return True

    def should_defer_preflight_to_real_usage(self, rough_tokens):
        _rec(self, "should_defer_preflight_to_real_usage", rough_tokens=rough_tokens)
        return False

    def compress(self, messages, current_tokens=None, focus_topic=None, force=False, memory_context=""):
        _rec(self, "compress", current_tokens=current_tokens, focus_topic=focus_topic, force=force,
             memory_context=memory_context, messages=copy.deepcopy(list(messages)))
        self.compression_count += 1
        last_user = None
        for m in reversed(messages):
            if m.get("role") == "user":
                last_user = m
                break
        out = [{"role": "user", "content": "[probe summary of %d messages]" % len(messages)},
               {"role": "assistant", "content": "noted"}]
        if last_user is not None:
            out.append({k: v for k, v in last_user.items() if not k.startswith("_")})
        if self.compress_once:
            self.threshold_tokens = 10 ** 9
        return out

    def get_tool_schemas(self):
        _rec(self, "get_tool_schemas")
        return [{
            "name": "probe_echo",
            "description": "Echo text back (hostkit probe).",
            "parameters": {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]},
        }]

    def handle_tool_call(self, name, args, **kw):
        _rec(self, "handle_tool_call", name=name, args=args, kw_keys=sorted(kw),
             n_messages=len(kw.get("messages") or []))
        return json.dumps({"echo": (args or {}).get("text"), "engine": "probe", "session_id": self.session_id})


def _summary(value):
    if isinstance(value, (str, int, float, bool, type(None))):
        return value
    if isinstance(value, list):
        return {"type": "list", "len": len(value), "value": copy.deepcopy(value)}
    return repr(value)


def _pre_llm_call(**kw):
    HOOKS.append(("pre_llm_call", {k: _summary(v) for k, v in kw.items()}))
    return {"context": PROBE_CONTEXT}


def _post_llm_call(**kw):
    HOOKS.append(("post_llm_call", {k: _summary(v) for k, v in kw.items()}))
    return "return value is ignored"


def _on_session_end_hook(**kw):
    HOOKS.append(("on_session_end", {k: _summary(v) for k, v in kw.items()}))


def _command(raw_args):
    HOOKS.append(("command", raw_args))
    return "probe:" + str(raw_args)


def register(ctx):
    engine = ProbeEngine()
    ctx.register_context_engine(engine)
    ctx.register_hook("pre_llm_call", _pre_llm_call)
    ctx.register_hook("post_llm_call", _post_llm_call)
    ctx.register_hook("on_session_end", _on_session_end_hook)
    ctx.register_command("trove", _command, description="hostkit probe command", args_hint="[status]")
    REGISTER_INFO["has_register_skill"] = hasattr(ctx, "register_skill")
    try:
        ctx.register_skill("probe-skill", Path(__file__).parent / "SKILL.md", description="probe skill")
        REGISTER_INFO["register_skill"] = "ok"
    except Exception as exc:
        REGISTER_INFO["register_skill"] = repr(exc)
    REGISTER_INFO["template_id"] = id(engine)
    _rec(engine, "register")
'''


def write_probe_plugin(dest: Union[str, Path], name: str = "trove-probe") -> Path:
    """Write the probe plugin (context engine "trove") into *dest* and return it."""
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    (dest / "plugin.yaml").write_text(_PROBE_MANIFEST.format(name=name), encoding="utf-8")
    (dest / "__init__.py").write_text(_PROBE_INIT, encoding="utf-8")
    (dest / "SKILL.md").write_text(_PROBE_SKILL, encoding="utf-8")
    return dest


def write_probe_settings(hermes_home: Union[str, Path], **settings: Any) -> None:
    """Write ``$HERMES_HOME/probe.json`` (read by the probe at ``update_model``)."""
    Path(hermes_home, "probe.json").write_text(json.dumps(settings), encoding="utf-8")


