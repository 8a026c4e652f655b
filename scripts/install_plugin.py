#!/usr/bin/env python3
"""Install this checkout into a Hermes home: link the plugin and its skill, optionally enable it.

    scripts/install.sh [--hermes-home DIR] [--profile NAME] [--enable] [--dry-run]

Links ``<home>/plugins/hermes-trove`` and ``<home>/skills/hermes-trove`` to this
checkout (``<home>`` is ``$HERMES_HOME`` or ``~/.hermes``, or
``<home>/profiles/NAME`` with ``--profile``). Re-running is harmless. Anything
else already at those paths is a conflict: nothing is changed and the reason is
printed. ``--enable`` adds ``context.engine: trove`` and ``hermes-trove`` to
``plugins.enabled`` in ``config.yaml`` after writing a timestamped backup.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from pathlib import Path

CHECKOUT = Path(__file__).resolve().parent.parent
PLUGIN_NAME = "hermes-trove"
CONFIG_LINES = "context:\n  engine: trove\nplugins:\n  enabled: [hermes-trove]\n"


class InstallError(RuntimeError):
    """A conflict or problem that stops the install before anything changes."""


def target_home(hermes_home: str | None, profile: str | None) -> Path:
    """The Hermes home (or profile folder) to install into."""
    base = Path(hermes_home or os.environ.get("HERMES_HOME") or Path.home() / ".hermes")
    base = base.expanduser()
    return base / "profiles" / profile if profile else base


def planned_links(home: Path) -> list[tuple[Path, Path]]:
    """(link path, what it points to) for the plugin folder and the bundled skill."""
    return [(home / "plugins" / PLUGIN_NAME, CHECKOUT),
            (home / "skills" / PLUGIN_NAME, CHECKOUT / "skills" / PLUGIN_NAME)]


def preflight(links: list[tuple[Path, Path]]) -> list[Path]:
    """Links still to create; raises InstallError on anything in the way."""
    todo = []
    for link, target in links:
        if link.is_symlink():
            if link.resolve() == target.resolve():
                continue  # already installed from this checkout
            raise InstallError(f"{link} already links to {os.readlink(link)}, not this "
                               f"checkout ({target}); remove it first if you mean to switch")
        if link.exists():
            raise InstallError(f"{link} already exists and is not a link to this checkout; "
                               "move it away first (nothing was changed)")
        todo.append(link)
    return todo


def create_links(links: list[tuple[Path, Path]], todo: list[Path]) -> None:
    """Create the missing links (parents included)."""
    for link, target in links:
        if link in todo:
            link.parent.mkdir(parents=True, exist_ok=True)
            link.symlink_to(target, target_is_directory=True)


def _yaml_module():
    try:
        from ruamel.yaml import YAML  # keeps comments and order
        yaml = YAML()
        yaml.preserve_quotes = True
        return "ruamel", yaml
    except ImportError:
        pass
    try:
        import yaml
        return "pyyaml", yaml
    except ImportError:
        return None, None


def enable_in_config(config_path: Path) -> tuple[bool, Path | None]:
    """Set context.engine and plugins.enabled; return (changed, backup path)."""
    kind, yaml = _yaml_module()
    if kind is None:
        raise InstallError("no YAML library here (ruamel.yaml or PyYAML); add these lines to "
                           f"{config_path} by hand:\n{CONFIG_LINES}")
    text = config_path.read_text(encoding="utf-8") if config_path.exists() else ""
    data = (yaml.load(text) if kind == "ruamel" else yaml.safe_load(text)) if text.strip() else {}
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise InstallError(f"{config_path} is not a YAML mapping; nothing was changed")
    context = data.setdefault("context", {}) or {}
    plugins = data.setdefault("plugins", {}) or {}
    if not isinstance(context, dict) or not isinstance(plugins, dict):
        raise InstallError(f"{config_path}: 'context' and 'plugins' must be mappings")
    data["context"], data["plugins"] = context, plugins
    enabled = plugins.get("enabled") or []
    if not isinstance(enabled, list):
        raise InstallError(f"{config_path}: plugins.enabled must be a list")
    if context.get("engine") == "trove" and PLUGIN_NAME in enabled:
        return False, None
    context["engine"] = "trove"
    if PLUGIN_NAME not in enabled:
        enabled.append(PLUGIN_NAME)
    plugins["enabled"] = enabled
    backup = None
    if config_path.exists():
        backup = config_path.with_name(f"{config_path.name}.bak-{time.strftime('%Y%m%dT%H%M%S')}")
        shutil.copy2(config_path, backup)
    tmp = config_path.with_name(config_path.name + ".trove-tmp")
    with tmp.open("w", encoding="utf-8") as handle:
        if kind == "ruamel":
            yaml.dump(data, handle)
        else:
            yaml.safe_dump(data, handle, sort_keys=False)
    os.replace(tmp, config_path)
    return True, backup


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hermes-home", help="default: $HERMES_HOME or ~/.hermes")
    parser.add_argument("--profile", default=os.environ.get("HERMES_PROFILE"),
                        help="install into <home>/profiles/NAME (default: $HERMES_PROFILE)")
    parser.add_argument("--enable", action="store_true",
                        help="also edit config.yaml (a timestamped backup is written first)")
    parser.add_argument("--dry-run", action="store_true", help="check and print, change nothing")
    args = parser.parse_args(argv)
    home = target_home(args.hermes_home, args.profile)
    links = planned_links(home)
    try:
        todo = preflight(links)
        if args.dry_run:
            for link in todo:
                print(f"would link {link}")
            return 0
        create_links(links, todo)
        for link, target in links:
            print(f"{'linked' if link in todo else 'already linked'}: {link} -> {target}")
        if args.enable:
            changed, backup = enable_in_config(home / "config.yaml")
            if changed:
                print(f"enabled in {home / 'config.yaml'}"
                      + (f" (backup: {backup})" if backup else ""))
            else:
                print(f"already enabled in {home / 'config.yaml'}")
        else:
            print(f"\nTo switch it on, add to {home / 'config.yaml'}:\n\n{CONFIG_LINES}")
            print("(or run again with --enable)")
    except InstallError as exc:
        print(f"install refused: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
