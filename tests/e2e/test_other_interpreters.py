"""The start-up hook stays out of interpreters stallscope does not support, and -I/-E/-S are refused
(issue 18, case 10)."""

from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from stallscope import launcher
from tests.conftest import run_cli

INJECT = str(launcher.INJECT_DIR)


def _other_interpreters() -> list[str]:
    """Pythons of other versions on this machine that really run (pyenv shims may not)."""
    found = {shutil.which(name) for name in ("python2", "python2.7", "python3.8", "python3.9", "python3.12",
                                             "python3.13")}
    found |= set(glob.glob(os.path.expanduser("~/.pyenv/versions/*/bin/python")))
    mine = f"{sys.version_info[0]}.{sys.version_info[1]}"
    usable = []
    for path in sorted(p for p in found if p):
        probe = subprocess.run([path, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                               capture_output=True, text=True, timeout=30, env={"PATH": os.environ["PATH"]})
        if probe.returncode == 0 and probe.stdout.strip() != mine:
            usable.append(path)
    return usable


def _user_sitecustomize(tmp_path: Path) -> Path:
    folder = tmp_path / "usersite"
    folder.mkdir()
    (folder / "sitecustomize.py").write_text("import sys\nsys.stderr.write('USER-SITE ran\\n')\n")
    return folder


def test_another_python_started_by_the_script_sees_only_its_own_sitecustomize(tmp_path):
    others = _other_interpreters()
    if not others:
        pytest.skip("no Python of another version on this machine")
    usersite = _user_sitecustomize(tmp_path)
    report = tmp_path / "others.json"
    script = tmp_path / "starts_others.py"
    script.write_text(
        "import json, subprocess, sys\nresults = {}\n"
        f"for exe in {others!r}:\n"
        "    done = subprocess.run([exe, '-c', 'import sys; print(repr(sys.path))'], capture_output=True, text=True)\n"
        "    results[exe] = [done.returncode, done.stdout, done.stderr]\n"
        f"json.dump(results, open({str(report)!r}, 'w'))\n")
    existing = os.environ.get("PYTHONPATH")
    env = {**os.environ, "PYTHONPATH": str(usersite) + (os.pathsep + existing if existing else "")}
    done = subprocess.run([sys.executable, "-m", "stallscope", "run", "--store", str(tmp_path / "store"), "--",
                           sys.executable, str(script)], capture_output=True, text=True, timeout=240, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    package_parent = str(Path(launcher.__file__).resolve().parent.parent)
    for exe, (code, stdout, stderr) in json.loads(report.read_text()).items():
        assert code == 0, (exe, stderr)
        assert stderr.strip() == "USER-SITE ran", (exe, stderr)  # theirs ran, and nothing of ours spoke
        assert INJECT not in stdout and package_parent not in stdout, (exe, stdout)


def test_an_interpreter_that_cannot_import_stallscope_is_left_alone(tmp_path):
    """Another Python of a different version that cannot import stallscope, simulated: the hook is silent,
    borrows no packages, leaves sys.path as it was and still runs the user's own sitecustomize."""
    usersite = _user_sitecustomize(tmp_path)
    probe = ("import sys\nsys.modules['stallscope'] = None\n"  # importing stallscope now fails
             "import runpy\nrunpy.run_path(sys.argv[1], run_name='sitecustomize')\n"
             "print(repr(sys.path))\n")
    env = {**os.environ, "PYTHONPATH": f"{INJECT}{os.pathsep}{usersite}", "STALLSCOPE_RUN_DIR": str(tmp_path),
           "STALLSCOPE_PKG_PARENT": "/borrowed/packages", "STALLSCOPE_PYTHON_VERSION": "2.7"}
    done = subprocess.run([sys.executable, "-S", "-c", probe, str(Path(INJECT) / "sitecustomize.py")],
                          capture_output=True, text=True, timeout=60, env=env)
    assert done.returncode == 0, done.stderr
    assert done.stderr.strip() == "USER-SITE ran"
    assert "/borrowed/packages" not in done.stdout and INJECT not in done.stdout
    assert not (tmp_path / "events").exists()


@pytest.mark.parametrize("flag", ["-I", "-E", "-S", "-uE"])
def test_python_options_that_keep_the_recorder_out_are_refused_before_running(tmp_path, flag):
    marker = tmp_path / "ran"
    script = tmp_path / "t.py"
    script.write_text(f"open({str(marker)!r}, 'w').write('x')\n")
    result = run_cli(tmp_path, ["--", sys.executable, flag, str(script)])
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "cannot record this command" in result.stderr and f"-{flag[-1]}" in result.stderr
    assert not marker.exists()


def test_a_command_in_which_the_recorder_never_started_says_why(tmp_path):
    """A wrapper that runs Python with -I: stallscope cannot see the option, so the summary explains."""
    script = tmp_path / "t.py"
    script.write_text("print('hello')\n")
    wrapper = tmp_path / "wrapper.sh"
    wrapper.write_text(f"#!/bin/sh\nexec {sys.executable} -I {script}\n")
    wrapper.chmod(0o755)
    result = run_cli(tmp_path, ["--", str(wrapper)])
    assert result.returncode == 0, result.stderr[-2000:]
    assert any("the recorder started in no process" in n and "-I" in n for n in result.summary["notes"])
