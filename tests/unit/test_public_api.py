"""``import stallscope``: the library twins of the verbs stay functions whatever was imported before."""

from __future__ import annotations

import subprocess
import sys

import pytest

CHECK = """
import importlib, pkgutil, types
{first}
import stallscope
for name in stallscope.__all__:
    value = getattr(stallscope, name)
    assert not isinstance(value, types.ModuleType), (name, value)
assert stallscope.analyze.__module__ == "stallscope.analysis.job"
assert stallscope.doctor.__name__ == "run_doctor" and stallscope.run.__module__ == "stallscope.api"
assert stallscope.record.__module__ == "stallscope.inprocess" and callable(stallscope.record)
import stallscope.recorder.events as events  # the hot-path subpackage has a name of its own
assert events.__name__ == "stallscope.recorder.events"
clashes = set(stallscope.__all__).intersection(info.name for info in pkgutil.iter_modules(stallscope.__path__))
assert not clashes, clashes
print("ok")
"""

EVERYTHING = """
import pkgutil, importlib, stallscope as _s
for info in pkgutil.walk_packages(_s.__path__, "stallscope."):
    if "._inject" in info.name or info.name in ("stallscope.__main__", "stallscope.demo.reference_train"):
        continue
    importlib.import_module(info.name)
"""


@pytest.mark.parametrize("first", ["import stallscope.analysis, stallscope.health.system", EVERYTHING])
def test_public_names_are_never_subpackages(first: str) -> None:
    done = subprocess.run([sys.executable, "-c", CHECK.format(first=first)], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]


@pytest.mark.parametrize("interval", [-1, float("nan"), float("inf")])
def test_record_refuses_a_sampler_period_that_is_no_period(interval):
    import stallscope

    with pytest.raises(ValueError, match="sample_interval_s"):
        stallscope.record(sample_interval_s=interval)
