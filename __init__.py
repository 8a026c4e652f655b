"""hermes-trove: a lossless context engine plugin for Hermes Agent.

The host imports this folder as a package and calls ``register(ctx)`` once per
process. Everything here only wires parts together; the logic lives in the
modules next to this file.
"""

__version__ = "0.1.0"


def register(ctx):
    """Register the trove engine, its hooks, skill and slash command with the host."""
    from .plugin_wiring import register_plugin

    register_plugin(ctx)
