"""The host side of a trove setup, and which plugin code is running.

The most common setup mistake is invisible from the database: with
``context.engine: trove`` but ``hermes-trove`` missing from ``plugins.enabled``
the host silently falls back to its built-in compressor and nothing is stored.
``check_host`` reads ``$HERMES_HOME/config.yaml`` the way the host does and names
each problem with its fix; doctor (CLI, tool and ``/trove``) shows the result.

``plugin_identity`` says which code answers: the plugin folder, its version
and its git commit, branch and whether the checkout has local changes. Doctor
and status share it.
"""

from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

PLUGIN_NAME = "hermes-trove"
ENGINE_NAME = "trove"
RUNTIME_PACKAGES = ("tiktoken", "regex")
# Used when installed, never needed (requirements-extras.txt): module -> what it gives
OPTIONAL_PACKAGES = {"rs_bpe": "exact token counts ~3x faster"}
PLUGIN_ROOT = Path(__file__).resolve().parent.parent
GIT_TIMEOUT_S = 5
_identity_cache: dict[str, dict] = {}


def _git(root: Path, *args: str) -> str | None:
    """One git command's output in ``root``, or None when git or the repository is absent."""
    try:
        done = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True,
                              timeout=GIT_TIMEOUT_S, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def _manifest_version(root: Path) -> str | None:
    """``version:`` of the plugin's ``plugin.yaml`` (a plain line; no YAML parser needed)."""
    try:
        text = (root / "plugin.yaml").read_text(encoding="utf-8")
    except OSError:
        return None
    match = re.search(r"^version:\s*['\"]?([^'\"\s#]+)", text, re.MULTILINE)
    return match.group(1) if match else None


def plugin_identity(root: Path | None = None, refresh: bool = False) -> dict:
    """The running plugin's folder, version, and git commit/branch/dirty (None outside a
    checkout), so an operator can tell which code answered. Cached per process:
    the code does not change under a running host."""
    root = Path(root or PLUGIN_ROOT).resolve()
    key = str(root)
    if key in _identity_cache and not refresh:
        return dict(_identity_cache[key])
    commit = _git(root, "rev-parse", "HEAD")
    status = _git(root, "status", "--porcelain", "--untracked-files=no") if commit else None
    identity = {"path": key, "version": _manifest_version(root), "commit": commit,
                "branch": _git(root, "rev-parse", "--abbrev-ref", "HEAD") if commit else None,
                "dirty": bool(status) if status is not None else None}
    _identity_cache[key] = identity
    return dict(identity)


def describe_identity(identity: dict) -> str:
    """One line: ``<path> v<version> @ <commit12> (<branch>, dirty)``."""
    text = identity["path"] + (f" v{identity['version']}" if identity.get("version") else "")
    if identity.get("commit"):
        text += f" @ {identity['commit'][:12]} ({identity['branch']}"
        text += ", dirty)" if identity.get("dirty") else ")"
    else:
        text += " (not a git checkout)"
    return text


def _check(name: str, status: str, detail: str, **data: Any) -> dict:
    return {"name": name, "status": status, "detail": detail, **data}


def read_host_config(home: Path) -> tuple[dict | None, str | None]:
    """``$HERMES_HOME/config.yaml`` as a mapping, or (None, why it cannot be read)."""
    path = home / "config.yaml"
    if not path.is_file():
        return None, f"no {path}"
    try:
        import yaml
    except ImportError:
        return None, f"PyYAML is not importable in {sys.executable}, so {path} was not read"
    try:
        document = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        return None, f"{path} cannot be read: {str(exc).splitlines()[0] if str(exc) else exc}"
    if not isinstance(document, dict):
        return None, f"{path} is not a mapping"
    return document, None


def _section(document: dict, key: str) -> dict:
    value = document.get(key)
    return value if isinstance(value, dict) else {}


def _config_checks(document: dict, path: Path) -> list[dict]:
    """Plugin enabled, engine selected, compression on: each with its fix."""
    plugins = _section(document, "plugins")
    enabled = plugins.get("enabled") if isinstance(plugins.get("enabled"), list) else []
    disabled = plugins.get("disabled") if isinstance(plugins.get("disabled"), list) else []
    results = []
    if PLUGIN_NAME in disabled:
        results.append(_check("host_plugin_enabled", "fail", f"{PLUGIN_NAME} is in "
                               f"plugins.disabled of {path}: the host does not load it; fix: "
                               f"hermes plugins enable {PLUGIN_NAME}"))
    elif PLUGIN_NAME not in enabled:
        results.append(_check("host_plugin_enabled", "fail", f"{PLUGIN_NAME} is not in "
                              f"plugins.enabled of {path}: the host falls back to its built-in "
                              f"compressor and nothing is stored; fix: hermes plugins enable "
                              f"{PLUGIN_NAME} (or add it to plugins.enabled)"))
    else:
        results.append(_check("host_plugin_enabled", "ok", f"{PLUGIN_NAME} is in plugins.enabled"))
    engine = _section(document, "context").get("engine")
    if engine != ENGINE_NAME:
        results.append(_check("host_engine_selected", "fail", f"context.engine is {engine!r} in "
                              f"{path}, so the host does not use trove; fix: set "
                              f"context.engine: {ENGINE_NAME}"))
    else:
        results.append(_check("host_engine_selected", "ok", f"context.engine: {ENGINE_NAME}"))
    compression = _section(document, "compression").get("enabled", True)
    if compression is False:
        results.append(_check("host_compression_enabled", "warn", f"compression.enabled is false "
                              f"in {path}: messages are stored but the host never asks trove to "
                              "compact, so long sessions overflow; fix: set compression.enabled: "
                              "true"))
    else:
        results.append(_check("host_compression_enabled", "ok", "compression.enabled"))
    return results


def hermes_python() -> str | None:
    """The interpreter that runs the ``hermes`` command (its script's ``#!`` line), or
    None when ``hermes`` is not on PATH or is not a Python script."""
    found = shutil.which("hermes")
    if not found:
        return None
    try:
        with open(found, "rb") as handle:
            first = handle.readline(512).decode("utf-8", "replace").strip()
    except OSError:
        return None
    if not first.startswith("#!") or "python" not in first:
        return None
    command = first[2:].split()
    return command[-1] if command and Path(command[-1]).name.startswith("python") else None


def _missing_in(python: str) -> list[str] | None:
    """Runtime and optional packages ``python`` cannot import (None when it cannot be
    asked)."""
    code = ("import importlib.util, sys; print(' '.join(n for n in sys.argv[1:]"
            " if importlib.util.find_spec(n) is None))")
    try:
        done = subprocess.run([python, "-c", code, *RUNTIME_PACKAGES, *OPTIONAL_PACKAGES],
                              capture_output=True,
                              text=True, timeout=GIT_TIMEOUT_S * 3, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.split() if done.returncode == 0 else None


def _package_check() -> dict:
    """tiktoken and regex importable in the Python that runs Hermes: this one inside the
    host; from the CLI, the ``hermes`` command's interpreter when it can be found."""
    python = sys.executable
    missing = [name for name in (*RUNTIME_PACKAGES, *OPTIONAL_PACKAGES)
               if importlib.util.find_spec(name) is None]
    other = hermes_python()
    if other and Path(other).resolve() != Path(sys.executable).resolve():
        asked = _missing_in(other)
        if asked is not None:
            python, missing = other, asked
    optional = [name for name in missing if name in OPTIONAL_PACKAGES]
    missing = [name for name in missing if name not in OPTIONAL_PACKAGES]
    extras = "".join(f"; optional {name} not installed ({OPTIONAL_PACKAGES[name]} with "
                     f"{python} -m pip install -r {PLUGIN_ROOT / 'requirements-extras.txt'})"
                     for name in optional)
    if missing:
        return _check("runtime_packages", "warn", f"not importable in {python}: "
                      f"{', '.join(missing)} (token counts fall back to estimates, message "
                      f"patterns are off); fix: {python} -m pip install -r "
                      f"{PLUGIN_ROOT / 'requirements.txt'}{extras}", missing=missing,
                      python=python)
    return _check("runtime_packages", "ok", f"{', '.join(RUNTIME_PACKAGES)} importable in "
                  f"{python}{extras}", python=python)


def _install_check(home: Path, identity: dict) -> dict:
    """The plugin folder the host loads, and which code that is."""
    installed = home / "plugins" / PLUGIN_NAME
    if not installed.exists():
        return _check("plugin_install", "warn", f"no {installed}: the host does not find the "
                      f"plugin; fix: scripts/install.sh or hermes plugins install (running "
                      f"code: {describe_identity(identity)})", identity=identity)
    here = installed.resolve() == Path(identity["path"])
    return _check("plugin_install", "ok" if here else "warn",
                  f"{installed} -> {describe_identity(identity)}" if here else
                  f"{installed} is {installed.resolve()}, not the running code "
                  f"{describe_identity(identity)}; the host loads the former", identity=identity)


def check_host(home: Path) -> list[dict]:
    """Every host-side check for ``$HERMES_HOME`` = ``home``, each with its fix."""
    identity = plugin_identity()
    document, problem = read_host_config(home)
    if document is None:
        results = [_check("host_config", "warn", f"{problem}: cannot tell whether Hermes loads "
                          f"trove; fix: set plugins.enabled: [{PLUGIN_NAME}] and "
                          f"context.engine: {ENGINE_NAME} in {home / 'config.yaml'}")]
    else:
        results = _config_checks(document, home / "config.yaml")
    return results + [_package_check(), _install_check(home, identity)]
