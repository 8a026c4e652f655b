"""Which session the host is in and whose it is: review-fork recognition, session
switches the host makes without ``on_session_start`` (CLI /new, /resume, /branch)
and owner keys for shared gateways (see docs/architecture.md, "Host session paths").
"""
