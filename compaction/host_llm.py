"""Asking the user's own models through the host's auxiliary client.

Summaries (task ``compression``) and expansion answers use whatever model the
user configured for Hermes's auxiliary tasks, unless a TROVE_* model override
names one. Outside a turn (slash commands, exit hooks) the host has no live
runtime in scope, so the runtime recorded from ``update_model()`` is passed.
Nothing here is imported before it is needed: the plugin must load even where
the host's client cannot.
"""

from __future__ import annotations

import logging
from typing import Callable, Optional

from .summarize import strip_reasoning

log = logging.getLogger(__name__)

LLMCall = Callable[[str, Optional[str], float], str]


def _response_text(response) -> str:
    """The message text of an OpenAI-style response object or dict."""
    try:
        choice = response.choices[0]
        content = choice.message.content
    except (AttributeError, IndexError, TypeError):
        try:
            content = response["choices"][0]["message"]["content"]
        except (KeyError, IndexError, TypeError):
            content = None
    if isinstance(content, list):
        content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return content if isinstance(content, str) else ""


def make_llm_call(runtime: dict, task: str) -> LLMCall | None:
    """A ``(prompt, model, timeout_s) -> text`` callable backed by the host, or None
    when the host's auxiliary client cannot be imported here."""
    try:
        from agent import auxiliary_client
    except Exception:  # the host is absent (offline scripts) or broken
        return None
    main_runtime = {k: v for k, v in runtime.items() if v not in (None, "")} or None

    def call(prompt: str, model: str | None, timeout_s: float) -> str:
        kwargs = {"task": task, "messages": [{"role": "user", "content": prompt}],
                  "timeout": timeout_s}
        if main_runtime:
            kwargs["main_runtime"] = main_runtime
        if model:
            kwargs["model"] = model
        protect = getattr(auxiliary_client, "aux_interrupt_protection", None)
        if protect is not None:
            with protect():
                response = auxiliary_client.call_llm(**kwargs)
        else:
            response = auxiliary_client.call_llm(**kwargs)
        text = strip_reasoning(_response_text(response))
        if not text.strip():
            raise RuntimeError("empty answer from the auxiliary model")
        return text

    return call
