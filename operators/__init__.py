"""What operators run (``/trove`` and ``scripts/trove.py``): backup-first apply
paths, rotation, cleaning, export, the HTML DAG view and transcript replay.
Top layer: may use the engine.
"""
