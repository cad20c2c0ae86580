"""Post-import hooks run after the module body, once, and leave the module's loader untouched."""

from __future__ import annotations

import importlib
import sys

from stallscope.recorder import importhook


def test_hook_runs_after_import_and_restores_loader(tmp_path, monkeypatch):
    (tmp_path / "ss_probe_mod.py").write_text("VALUE = 41\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    seen = []

    def hook(module):
        seen.append(module.VALUE)
        module.VALUE += 1

    importhook.when_imported("ss_probe_mod", hook)
    try:
        module = importlib.import_module("ss_probe_mod")
        assert seen == [41] and module.VALUE == 42
        assert type(module.__loader__).__name__ == "SourceFileLoader"
        assert module.__spec__.loader is module.__loader__
    finally:
        sys.modules.pop("ss_probe_mod", None)


def test_hook_on_already_imported_module_runs_now():
    seen = []
    importhook.when_imported("json", lambda m: seen.append(m.__name__))
    assert seen == ["json"]


def test_failing_hook_does_not_break_import(tmp_path, monkeypatch, capsys):
    (tmp_path / "ss_probe_bad.py").write_text("X = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))

    def broken(module):
        raise RuntimeError("patch failed")

    importhook.when_imported("ss_probe_bad", broken)
    try:
        assert importlib.import_module("ss_probe_bad").X == 1
        assert "could not instrument ss_probe_bad" in capsys.readouterr().err
    finally:
        sys.modules.pop("ss_probe_bad", None)
