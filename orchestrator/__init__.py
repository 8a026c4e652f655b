"""Parts of ``TroveEngine`` by concern, as mixins the engine class inherits.

``tool_side`` (the trove_* tools and status) and ``maintenance`` (rotation and the
work started off the turn's path). They sit above ``tools`` and below ``engine``
and never import ``engine.py``.
"""
