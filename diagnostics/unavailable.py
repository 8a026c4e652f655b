"""What the trove tools answer while the database cannot be used.

Every tool still returns JSON (the host turns an exception into a bare error
string, and the model should learn what is wrong rather than retry blindly):
status and doctor report the engine's state and the database problem with its
repair; the recall tools return an error that says the same.
"""

from __future__ import annotations

from typing import Mapping

from .health import check


def tool_answer(name: str, fault: Mapping, status: Mapping) -> dict:
    """The JSON payload of tool ``name`` while the database is unusable (``fault`` from
    ``storage.faults.describe``; ``status`` the engine's own status, read without the
    database)."""
    database = {"ok": False, "path": fault.get("path"), "problem": fault.get("problem"),
                "repair": fault.get("repair")}
    statement = fault.get("kind") == "statement"   # one call failed; the store is in use
    if name == "trove_status":
        return {"database": database, "engine": dict(status),
                "note": "this call failed; the store stays in use and later turns are stored"
                if statement else "the engine runs with a bounded prompt and stores nothing "
                                  "until the database works again"}
    if name == "trove_doctor":
        return {"overall": "fail", "checks": [check(
            "database_open", "fail", str(fault.get("problem")), repair=fault.get("repair"),
            path=fault.get("path"))]}
    if statement:
        return {"error": f"{name}: {fault.get('problem')}", "repair": fault.get("repair"),
                "database": database}
    return {"error": f"{name}: the trove database cannot be used: {fault.get('problem')}",
            "repair": fault.get("repair"), "database": database}
