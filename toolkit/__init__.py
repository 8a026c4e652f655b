"""The agent tools' handlers by concern, below ``tools.py`` (which dispatches to them).

``scope`` decides what one call may read, ``render`` turns rows into answers,
``search_tools`` / ``expand_query`` / ``read_tools`` are the handlers. The tool
context is ``tools.ToolContext``; it is typed ``Any`` here because this package
sits below ``tools.py`` and must not import it.
"""
