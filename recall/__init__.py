"""Finding things again: query planning (safe FTS5 expressions), ranking and
fusion of search arms, and search over externalized tool outputs.
"""
