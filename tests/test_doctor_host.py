"""Doctor's host-side checks (config.yaml, packages, plugin folder, git identity), config
warnings shown and logged once, against hand-written configs and the real host."""
import logging
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

import hostkit as hk
from hostkit import fake_llm  # noqa: F401 (fixture)
from hermes_trove.diagnostics import host
from test_cli import run

REPO = Path(__file__).resolve().parent.parent
GOOD = {"plugins": {"enabled": ["hermes-trove"]}, "context": {"engine": "trove"},
        "compression": {"enabled": True}}


def home_with(tmp_path, config, install=True):
    """A HERMES_HOME with ``config`` as config.yaml and (optionally) the plugin linked in."""
    home = tmp_path / "home"
    (home / "plugins").mkdir(parents=True)
    if config is not None:
        (home / "config.yaml").write_text(yaml.safe_dump(config), encoding="utf-8")
    if install:
        (home / "plugins" / "hermes-trove").symlink_to(REPO, target_is_directory=True)
    return home


def by_name(checks):
    return {c["name"]: c for c in checks}


def test_a_good_setup_passes(tmp_path):
    checks = by_name(host.check_host(home_with(tmp_path, GOOD)))
    assert {n: c["status"] for n, c in checks.items()} == {
        "host_plugin_enabled": "ok", "host_engine_selected": "ok",
        "host_compression_enabled": "ok", "runtime_packages": "ok", "plugin_install": "ok"}
    assert checks["plugin_install"]["identity"]["path"] == str(REPO)


@pytest.mark.parametrize("change,name,status,words", [
    ({"plugins": {"enabled": []}}, "host_plugin_enabled", "fail",
     "hermes-trove is not in plugins.enabled"),
    ({"plugins": {"enabled": ["hermes-trove"], "disabled": ["hermes-trove"]}},
     "host_plugin_enabled", "fail", "is in plugins.disabled"),
    ({"context": {"engine": "compressor"}}, "host_engine_selected", "fail",
     "fix: set context.engine: trove"),
    ({"context": {}}, "host_engine_selected", "fail", "context.engine is None"),
    ({"compression": {"enabled": False}}, "host_compression_enabled", "warn",
     "fix: set compression.enabled: true"),
])
def test_each_host_mistake_is_named_with_its_fix(tmp_path, change, name, status, words):
    checks = by_name(host.check_host(home_with(tmp_path, {**GOOD, **change})))
    assert checks[name]["status"] == status and words in checks[name]["detail"]
    assert "fix:" in checks[name]["detail"]


def test_missing_config_and_missing_install(tmp_path):
    checks = by_name(host.check_host(home_with(tmp_path, None, install=False)))
    assert checks["host_config"]["status"] == "warn" and "no " in checks["host_config"]["detail"]
    assert checks["plugin_install"]["status"] == "warn"
    assert "scripts/install.sh" in checks["plugin_install"]["detail"]


def test_plugin_identity_is_the_checkout(tmp_path):
    identity = host.plugin_identity(REPO, refresh=True)
    git = lambda *a: subprocess.run(["git", "-C", str(REPO), *a], capture_output=True,  # noqa
                                    text=True).stdout.strip()
    assert identity["commit"] == git("rev-parse", "HEAD")
    assert identity["branch"] == git("rev-parse", "--abbrev-ref", "HEAD")
    assert identity["dirty"] == bool(git("status", "--porcelain", "--untracked-files=no"))
    assert identity["version"] and identity["commit"][:12] in host.describe_identity(identity)
    bare = host.plugin_identity(tmp_path, refresh=True)
    assert bare["commit"] is None and "not a git checkout" in host.describe_identity(bare)


def test_cli_doctor_names_a_disabled_plugin_even_without_a_database(tmp_path):
    home = home_with(tmp_path, {**GOOD, "plugins": {"enabled": []}})
    done = run(home, "doctor")
    assert done.returncode == 1
    assert "[WARN] database: no trove database at" in done.stdout
    assert "hermes-trove is not in plugins.enabled" in done.stdout
    assert "fix: hermes plugins enable hermes-trove" in done.stdout
    assert not (home / "trove.db").exists()


def test_doctor_shows_each_config_warning(tmp_path):
    home = home_with(tmp_path, {**GOOD, "trove": {"bogus_knob": 1}})
    done = run(home, "doctor", env={"TROVE_CONDENSED_MIN_FANOUT": "lots"})
    assert "2 warning(s)" in done.stdout
    assert "- " in done.stdout and "unknown setting 'trove.bogus_knob'" in done.stdout
    assert "TROVE_CONDENSED_MIN_FANOUT" in done.stdout


@pytest.mark.host
def test_real_host_disabled_plugin_stores_nothing_and_doctor_says_why(tmp_path, fake_llm):
    home = hk.make_hermes_home(tmp_path, fake_llm.port, extra_config={"plugins": {"enabled": []}})
    with hk.host_env(home) as env:
        env.server = fake_llm
        agent = hk.make_agent()
        assert not hk.uses_plugin_engine(agent, "trove", plugin_name="hermes-trove")
        hk.run_turns(agent, ["hi"])
    assert not (home / "trove.db").exists()
    done = run(home, "doctor")
    assert done.returncode == 1 and "hermes-trove is not in plugins.enabled" in done.stdout


@pytest.mark.host
def test_real_host_logs_each_config_warning_once(tmp_path, fake_llm, caplog):
    home = hk.make_hermes_home(tmp_path, fake_llm.port, extra_config={
        "trove": {"bogus_knob": 1, "enable_slash_command": True}})
    caplog.set_level(logging.WARNING)
    with hk.host_env(home) as env:
        env.server = fake_llm
        agent = hk.make_agent()
        assert hk.uses_plugin_engine(agent, "trove", plugin_name="hermes-trove")
        hk.run_turns(agent, ["hi"])
        doctor = hk.run_slash_command("trove", "doctor")
    logged = [r for r in caplog.records if "bogus_knob" in r.getMessage()]
    assert len(logged) == 1
    assert "unknown setting 'trove.bogus_knob'" in str(doctor)
    assert "[ok] host_plugin_enabled" in str(doctor)


def fake_hermes(folder, packages_present):
    """A ``hermes`` script whose interpreter is a fake Python answering the import probe."""
    folder.mkdir()
    fake_python = folder / "python3"
    missing = " ".join(p for p in (*host.RUNTIME_PACKAGES, *host.OPTIONAL_PACKAGES)
                       if p not in packages_present)
    fake_python.write_text(f"#!/bin/sh\necho '{missing}'\n")
    fake_python.chmod(0o755)
    script = folder / "hermes"
    script.write_text(f"#!{fake_python}\nprint('hermes')\n")
    script.chmod(0o755)
    return fake_python


@pytest.mark.parametrize("present,status", [(("tiktoken", "regex", "rs_bpe"), "ok"),
                                            (("tiktoken",), "warn")])
def test_packages_are_checked_in_the_python_that_runs_hermes(tmp_path, monkeypatch, present,
                                                             status):
    python = fake_hermes(tmp_path / "bin", present)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:/usr/bin:/bin")
    assert host.hermes_python() == str(python)
    check = by_name(host.check_host(home_with(tmp_path, GOOD)))["runtime_packages"]
    assert check["status"] == status and check["python"] == str(python)
    if status == "warn":
        assert f"fix: {python} -m pip install -r" in check["detail"] and "regex" in check["detail"]


@pytest.mark.parametrize("present", [("tiktoken", "regex"), ("tiktoken", "regex", "rs_bpe")])
def test_the_optional_counter_is_named_but_never_a_warning(tmp_path, monkeypatch, present):
    python = fake_hermes(tmp_path / "bin", present)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:/usr/bin:/bin")
    check = by_name(host.check_host(home_with(tmp_path, GOOD)))["runtime_packages"]
    assert check["status"] == "ok"
    named = "optional rs_bpe not installed" in check["detail"]
    assert named == ("rs_bpe" not in present)
    if named:
        assert "requirements-extras.txt" in check["detail"]
