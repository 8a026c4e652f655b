"""Turning old context into summaries and assembling the bounded prompt: the
compactor, the summarizer and its escalation levels, the host LLM bridge,
token counting, prompt assembly and the safe fallback prompt.
"""
