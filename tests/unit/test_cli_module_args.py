"""``stallscope run [options] -m MODULE ARGS``: what follows the module's name is the module's, as with python -m."""

from __future__ import annotations

import pytest

from stallscope.cli.main import _module_arguments_are_the_modules as split


@pytest.mark.parametrize("argv,expected", [
    (["run", "-m", "mod", "--steps", "5"], ["run", "-m", "mod", "--", "--steps", "5"]),
    (["run", "--store", "S", "-m", "mod", "--epochs", "1"],
     ["run", "--store", "S", "-m", "mod", "--", "--epochs", "1"]),
    (["run", "--ste", "3", "-m", "mod", "--steps", "5"], ["run", "--ste", "3", "-m", "mod", "--", "--steps", "5"]),
    (["run", "--steps=5", "-m", "mod", "a"], ["run", "--steps=5", "-m", "mod", "--", "a"]),
    (["run", "-qm", "mod", "--json", "x"], ["run", "-qm", "mod", "--", "--json", "x"]),
    (["run", "-qmmod", "--json", "x"], ["run", "-qmmod", "--", "--json", "x"]),
    (["run", "-mmod", "-x"], ["run", "-mmod", "--", "-x"]),
    # already separated, nothing after the module, or a -m that is the command's own: left as they are
    (["run", "-m", "mod", "--", "-x"], ["run", "-m", "mod", "--", "-x"]),
    (["run", "-q", "-m", "mod"], ["run", "-q", "-m", "mod"]),
    (["run", "train.py", "-m", "x"], ["run", "train.py", "-m", "x"]),
    (["run", "--", "python", "-m", "x", "--steps", "3"], ["run", "--", "python", "-m", "x", "--steps", "3"]),
    (["report", "-m"], ["report", "-m"]),
])
def test_arguments_after_the_module_are_the_modules(argv, expected):
    assert split(argv) == expected
