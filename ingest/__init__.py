"""What happens to a message before it is stored: the ingest policy (which
sessions and messages are kept), noise filters and secret redaction.
"""
