"""The database file and what lives in it below the message/summary level: the
connection and its locks, schema migrations, text codec, message identity,
externalized payload files, backups and integrity checks.

Lowest layer: imports nothing of the plugin but ``config``.
"""
