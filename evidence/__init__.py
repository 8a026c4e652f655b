"""Evidence: exact refs into stored messages, value parsing, verified computation, packs.

Sits above recall and below the tool schemas. It never decides scope itself:
every ref is loaded through a ``load(store_id)`` callable the tool layer builds
from ``tools.Access`` (so a ref is valid only where its message may be read).
"""
