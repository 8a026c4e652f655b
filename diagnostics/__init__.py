"""Read-only health checks shared by every front end: ``trove_status``,
``trove_inspect``, ``trove_doctor``, ``/trove doctor`` and ``scripts/trove.py``.
Sits beside recall (below ``tools.py``), so the tools can call it.
"""
