"""The catalogue of fixes is the one place a change is declared: the analysis builds every recommendation
from it, emits every id in it, and its settings are ``--set`` names."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import stallscope.analysis
from stallscope.analysis.fixes import FIXES, MAX_NORMALIZE_CUT, planned
from stallscope.analysis.recommend import MIN_GAIN
from stallscope.settings import SETTABLE

ANALYSIS = Path(stallscope.analysis.__file__).parent
STAGES = {"storage", "decode", "transform", "loader", "transfer", "compute", "sync"}


def _sources() -> dict[str, str]:
    return {path.name: path.read_text() for path in ANALYSIS.glob("*.py")}


def test_no_analysis_module_builds_a_recommendation_but_the_catalogue() -> None:
    for name, text in _sources().items():
        if name == "fixes.py":
            continue
        calls = [node for node in ast.walk(ast.parse(text)) if isinstance(node, ast.Call)
                 and getattr(node.func, "id", getattr(node.func, "attr", None)) == "Recommendation"]
        assert not calls, f"{name}:{calls[0].lineno} builds a Recommendation: use fixes.advise(id, ...)"


def test_every_fix_in_the_catalogue_is_emitted_somewhere_and_every_emitted_id_is_in_it() -> None:
    emitted: set[str] = set()
    for text in _sources().values():
        emitted |= set(re.findall(r'\b(?:advise|priced)\(\s*"([a-z0-9-]+)"', text))
    assert emitted == set(FIXES), (emitted - set(FIXES), set(FIXES) - emitted)


def test_each_fix_names_a_stage_and_only_settable_settings() -> None:
    for fix in FIXES.values():
        assert fix.stage in STAGES, fix
        assert set(fix.settings) <= set(SETTABLE), fix
        assert set(fix.scale) <= STAGES and all(0 < v < 1 for v in fix.scale.values()), fix


def test_plan_prices_the_stage_fixes_with_the_runs_own_scales() -> None:
    assert [f.id for f in planned()] == ["pack-dataset", "reduced-size-decode", "uint8-device-normalize"]
    assert FIXES["pack-dataset"].scaled() == {"storage": 0.3}
    normalize = FIXES["uint8-device-normalize"]
    assert normalize.scaled(0.4) == {"transform": 0.6, "loader": 0.5}
    assert normalize.scaled(0.99)["transform"] == 1 - MAX_NORMALIZE_CUT  # conversion and copy stay on the CPU
    rec = normalize.advise(1.3, facts={"normalize_fraction": 0.4})
    assert (rec.id, rec.node, rec.predicted_speedup, rec.overrides) == ("uint8-device-normalize", "transform", 1.3, {})
    assert MIN_GAIN > 1


def test_every_fix_has_its_words_and_no_words_are_left_without_a_fix() -> None:
    from stallscope.render.words import recommendations

    assert set(recommendations._SAYS) == set(FIXES)
