"""scripts/install.sh and scripts/update.sh against temporary Hermes homes."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

import hostkit as hk
from hostkit import fake_llm  # noqa: F401 (fixture)

ROOT = Path(__file__).resolve().parent.parent
INSTALL = ROOT / "scripts" / "install.sh"
UPDATE = ROOT / "scripts" / "update.sh"


def run(cmd, **kw):
    env = dict(os.environ, PYTHON=sys.executable)
    env.update(kw.pop("env", {}))
    return subprocess.run([str(c) for c in cmd], capture_output=True, text=True, env=env, **kw)


def test_install_links_plugin_and_skill_and_is_idempotent(tmp_path):
    home = tmp_path / "hermes"
    first = run([INSTALL, "--hermes-home", home])
    assert first.returncode == 0, first.stderr
    plugin = home / "plugins" / "hermes-trove"
    skill = home / "skills" / "hermes-trove"
    assert plugin.is_symlink() and plugin.resolve() == ROOT
    assert skill.is_symlink() and (skill / "SKILL.md").resolve().parent == (ROOT / "skills" / "hermes-trove")
    assert "engine: trove" in first.stdout and "hermes-trove" in first.stdout
    again = run([INSTALL, "--hermes-home", home])
    assert again.returncode == 0 and "already linked" in again.stdout


def test_install_into_a_profile(tmp_path):
    result = run([INSTALL, "--hermes-home", tmp_path, "--profile", "work"])
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "profiles" / "work" / "plugins" / "hermes-trove").is_symlink()


def test_install_refuses_conflicts_and_changes_nothing(tmp_path):
    home = tmp_path / "hermes"
    (home / "plugins" / "hermes-trove").mkdir(parents=True)
    result = run([INSTALL, "--hermes-home", home, "--enable"])
    assert result.returncode == 2
    assert "already exists" in result.stderr
    assert not (home / "skills" / "hermes-trove").exists()
    assert not (home / "config.yaml").exists()
    other = tmp_path / "other"
    other.mkdir()
    (home / "plugins" / "hermes-trove").rmdir()
    (home / "plugins" / "hermes-trove").symlink_to(other)
    result = run([INSTALL, "--hermes-home", home])
    assert result.returncode == 2 and "not this checkout" in result.stderr


def test_enable_edits_config_with_a_backup_and_keeps_other_settings(tmp_path):
    home = tmp_path / "hermes"
    home.mkdir()
    original = "# my settings\nmodel:\n  default: gpt-x\nplugins:\n  enabled: [other-plugin]\n"
    (home / "config.yaml").write_text(original)
    result = run([INSTALL, "--hermes-home", home, "--enable"])
    assert result.returncode == 0, result.stderr
    data = yaml.safe_load((home / "config.yaml").read_text())
    assert data["context"]["engine"] == "trove"
    assert data["plugins"]["enabled"] == ["other-plugin", "hermes-trove"]
    assert data["model"]["default"] == "gpt-x"
    backups = list(home.glob("config.yaml.bak-*"))
    assert len(backups) == 1 and backups[0].read_text() == original
    again = run([INSTALL, "--hermes-home", home, "--enable"])
    assert "already enabled" in again.stdout
    assert len(list(home.glob("config.yaml.bak-*"))) == 1


@pytest.mark.host
def test_installed_plugin_loads_in_the_real_host(tmp_path, fake_llm):
    home = hk.make_hermes_home(tmp_path, fake_llm.port, plugin_dir=None)
    result = run([INSTALL, "--hermes-home", home, "--enable"])
    assert result.returncode == 0, result.stderr
    with hk.host_env(home):
        agent = hk.make_agent()
        assert hk.uses_plugin_engine(agent, "trove", plugin_name="hermes-trove")
        hk.run_turns(agent, ["hello"])
    assert (home / "trove.db").exists()


def _git(*args, cwd):
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=True,
                          env=dict(os.environ, GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@t",
                                   GIT_COMMITTER_NAME="t", GIT_COMMITTER_EMAIL="t@t"))


def test_update_fast_forwards_and_refuses_local_changes(tmp_path):
    origin = tmp_path / "origin"
    origin.mkdir()
    _git("init", "-q", "-b", "main", cwd=origin)
    (origin / "scripts").mkdir()
    (origin / "scripts" / "update.sh").write_text(UPDATE.read_text())
    (origin / "VERSION").write_text("1\n")
    _git("add", "-A", cwd=origin)
    _git("commit", "-qm", "v1", cwd=origin)
    clone = tmp_path / "clone"
    _git("clone", "-q", str(origin), str(clone), cwd=tmp_path)
    (origin / "VERSION").write_text("2\n")
    _git("commit", "-qam", "v2", cwd=origin)
    result = run(["bash", clone / "scripts" / "update.sh"])
    assert result.returncode == 0, result.stderr
    assert "updated" in result.stdout and (clone / "VERSION").read_text() == "2\n"
    assert "already up to date" in run(["bash", clone / "scripts" / "update.sh"]).stdout
    (clone / "VERSION").write_text("local edit\n")
    refused = run(["bash", clone / "scripts" / "update.sh"])
    assert refused.returncode == 2 and "uncommitted" in refused.stderr
