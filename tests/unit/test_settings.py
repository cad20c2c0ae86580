"""settings.py owns the --set vocabulary and every STALLSCOPE_* name: nothing else spells one out."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from stallscope import settings
from stallscope.settings import OverrideError, format_value, parse_overrides, set_arguments

SRC = Path(settings.__file__).parent
NAMES = {value for key, value in vars(settings).items() if key.startswith("ENV_")}


def test_no_module_but_settings_spells_an_environment_variable() -> None:
    inject = SRC / "recorder" / "_inject" / "sitecustomize.py"
    for path in SRC.rglob("*.py"):
        if path in (SRC / "settings.py", inject):
            continue
        code = "\n".join(line for line in path.read_text().splitlines() if not line.lstrip().startswith("#"))
        literals = set(re.findall(r"[\"'](STALLSCOPE_[A-Z_]+)[\"']", code))
        assert not literals, f"{path.relative_to(SRC)} spells {literals}: import them from stallscope.settings"
    # the start-up hook runs before stallscope can be imported, so it spells them: they must be settings' own
    assert set(re.findall(r"\"(STALLSCOPE_[A-Z_]+)\"", inject.read_text())) <= NAMES


def test_set_values_round_trip_through_their_arguments() -> None:
    values = {"num_workers": 4, "pin_memory": True, "prefetch_factor": None, "timeout": 1.5,
              "multiprocessing_context": "spawn"}
    args = set_arguments(values)
    assert args[:2] == ["--set", "num_workers=4"]
    assert parse_overrides(args[1::2]) == values
    assert format_value(False) == "false"
    with pytest.raises(OverrideError, match="expected true or false"):
        parse_overrides(["pin_memory=maybe"])


@pytest.mark.parametrize("item,reason", [("timeout=-1", "0 (wait forever) or more"), ("timeout=nan", "or more"),
                                         ("batch_size=0", "at least 1"), ("prefetch_factor=0", "at least 1"),
                                         ("multiprocessing_context=bogus", "choose one of"),
                                         ("num_workers=-2", "must not be negative"),
                                         ("num_workers=100000", "at most 1024 worker processes"),
                                         ("torch_threads=5000", "at most 1024 threads")])
def test_values_torch_would_crash_on_are_refused_here(item, reason):
    with pytest.raises(OverrideError, match=re.escape(reason)):
        parse_overrides([item])
    assert parse_overrides(["batch_size=none", "timeout=0", "multiprocessing_context=spawn"]) == {
        "batch_size": None, "timeout": 0.0, "multiprocessing_context": "spawn"}


def test_process_settings_come_from_their_one_list() -> None:
    """A process setting is declared once: --set accepts it, its help names it, advice writes its torch call."""
    from stallscope.cli.main import build_parser

    run_help = build_parser()._subparsers._group_actions[0].choices["run"].format_help()  # type: ignore[union-attr]
    for name, setting in settings.PROCESS_SETTINGS.items():
        assert settings.SETTABLE[name] == setting.kind
        assert name in " ".join(run_help.split())
        value = 2 if setting.kind == "int" else "file_system"
        when = "" if setting.env else " at the start of training"  # an environment variable is there from the start
        assert settings.in_code({name: value}, None) == f"{setting.call.format(value)}{when}"
        assert settings.in_code({name: value, "num_workers": 3}, None).startswith(setting.call.format(value))
