"""The demo's before/after measurement: the order of its runs, the speedup of the pairs, and how it applies each
recommendation to its reference script."""

import math

import numpy as np
import pytest
import torch
from PIL import Image

from stallscope.analysis.findings import Recommendation
from stallscope.analysis.fixes import FIXES
from stallscope.cli.demo_cmd import NOT_APPLIED, not_applied, paired_speedup, verification_order
from stallscope.demo.changes import (
    ALREADY_APPLIED,
    APPLY,
    NO_DATASET_CODE,
    UNKNOWN,
    NotApplied,
    ScriptFlags,
    ThroughSet,
    choose,
    how_to_apply,
)
from stallscope.demo.reference_train import build_transform, parse_args


def test_one_pair_is_the_after_run_alone():
    # the diagnosis run is the first before; one pair adds only its after
    assert verification_order(1) == ["after"]


def test_pairs_alternate_so_that_a_steady_drift_cancels():
    # with the diagnosis run first: before, after | after, before | before, after | after, before
    assert verification_order(2) == ["after", "after", "before"]
    assert verification_order(4) == ["after", "after", "before", "before", "after", "after", "before"]


def test_a_drift_steady_over_the_runs_cancels_in_two_pairs():
    # a machine that gets 10% slower with every run; the change doubles the speed
    speed = [1.0, 0.9, 0.81, 0.729]  # runs 1..4: before, after, after, before
    before = [100 * speed[0], 100 * speed[3]]
    after = [200 * speed[1], 200 * speed[2]]
    assert paired_speedup(before[:1], after[:1])[0] == pytest.approx(1.8)  # one pair: the drift's 10% in it
    speedup, low, high = paired_speedup(before, after)
    assert speedup == pytest.approx(2.0)
    assert (low, high) == pytest.approx((1.8, 2.0 * 0.81 / 0.729))


def test_the_speedup_is_the_geometric_mean_of_the_pairs():
    speedup, low, high = paired_speedup([200.0, 250.0], [300.0, 500.0])
    assert speedup == pytest.approx(math.sqrt(1.5 * 2.0))
    assert (low, high) == (1.5, 2.0)


def test_pairs_must_match():
    with pytest.raises(ValueError):
        paired_speedup([1.0, 2.0], [1.0])


# --- how the demo applies each recommendation (demo/changes.py) ----------------------------------------------------

def _emitted_ids() -> set[str]:
    """Every recommendation id the analysis can emit: the catalogue's (``test_fixes.py`` holds it to the code)."""
    return set(FIXES)


def test_every_recommendation_the_analysis_can_emit_is_applied_or_said_why_not():
    emitted = _emitted_ids()
    assert {"num-workers", "cheaper-transforms", "no-predicted-gain", "distributed-sampler"} <= emitted  # the scan works
    assert emitted - set(APPLY) == set(), "ids the demo does not know how to verify"
    assert set(APPLY) - emitted == set(), "ids no analysis emits any more"


def test_each_code_change_is_a_flag_of_the_reference_script_that_turns_it_on():
    plain = vars(parse_args(["--data", "d"]))
    for rid, how in APPLY.items():
        if isinstance(how, ScriptFlags):
            changed = {k for k, v in vars(parse_args(["--data", "d", *how.args])).items() if v != plain[k]}
            assert changed, (rid, how.args)
    assert {how.args for how in APPLY.values() if isinstance(how, ScriptFlags)} == {
        ("--cheaper-transforms",), ("--uint8-to-device",), ("--reduced-size-decode",)}


def test_every_reason_the_demo_gives_for_not_applying_a_change_has_its_words():
    for rid, how in APPLY.items():
        if isinstance(how, NotApplied):
            assert how.reason in NOT_APPLIED, rid
            assert not_applied(how, Recommendation(rid, "loader", None)) == NOT_APPLIED[how.reason]
    said = not_applied(NotApplied(ALREADY_APPLIED), Recommendation("cheaper-transforms", "transform", 1.3))
    assert said == "the reference script runs with it already (--cheaper-transforms)"


def test_a_change_with_overrides_goes_through_them_and_an_unknown_code_change_is_not_applied():
    assert how_to_apply(Recommendation("num-workers", "loader", 1.5, {"num_workers": 2})) == ThroughSet()
    assert how_to_apply(Recommendation("some-new-setting", "loader", 1.5, {"prefetch_factor": 4})) == ThroughSet()
    assert how_to_apply(Recommendation("cheaper-transforms", "transform", 1.3)) == ScriptFlags(("--cheaper-transforms",))
    assert how_to_apply(Recommendation("some-new-code-change", "decode", 1.3)) == NotApplied(UNKNOWN)


def test_the_demo_measures_the_first_change_it_can_apply_and_says_why_it_passed_over_the_others():
    command = ["python", "reference_train.py", "--workers", "0"]
    nothing = Recommendation("no-input-fix", "compute", None)
    dataset_code = Recommendation("dataset-code", "transform", 1.4)
    cheaper = Recommendation("cheaper-transforms", "transform", 1.3)
    workers = Recommendation("num-workers", "loader", 1.2, {"num_workers": 1})
    # advice to change nothing is passed over silently; a change the demo cannot make, with its reason
    assert choose([nothing, dataset_code, cheaper, workers], command) == (
        cheaper, [(dataset_code, NotApplied(NO_DATASET_CODE))])
    # a code change the command has already is no change to measure
    assert choose([cheaper, workers], [*command, "--cheaper-transforms"]) == (
        workers, [(cheaper, NotApplied(ALREADY_APPLIED))])
    assert choose([nothing], command) == (None, [])
    assert choose([], command) == (None, [])


def _smooth_image():
    """A smooth RGB image with a little noise (resampling filters differ most on noise)."""
    y, x = np.mgrid[0:300, 0:400]
    pixels = np.stack([127 + 120 * np.sin(x / 37 + c) * np.cos(y / 23 - c) for c in range(3)], axis=-1)
    noise = np.random.default_rng(0).normal(0, 2, pixels.shape)
    return Image.fromarray((pixels + noise).clip(0, 255).astype(np.uint8))


def test_the_cheaper_transforms_are_the_same_augmentations():
    """--cheaper-transforms changes how the augmentations run, not which: from the same random state, the standard
    recipe's crop and its cheaper twin's are the same crop (their resampling differs a little)."""
    image = _smooth_image()

    def crop(cheaper: bool, seed: int):
        torch.manual_seed(seed)
        return build_transform(96, heavy=False, cheaper=cheaper)(image)

    standard, cheaper = crop(False, 3), crop(True, 3)
    assert standard.shape == cheaper.shape == (3, 96, 96) and cheaper.dtype == torch.float32
    scale = standard.abs().mean()
    assert (standard - cheaper).abs().mean() < 0.05 * scale
    assert (crop(True, 4) - cheaper).abs().mean() > 0.05 * scale  # another crop is not that close


@pytest.mark.parametrize("heavy", [False, True])
def test_every_combination_of_the_flags_gives_the_batches_the_loop_expects(heavy):
    image = _smooth_image()
    for uint8 in (False, True):
        dtype = torch.uint8 if uint8 else torch.float32
        for cheaper in (False, True):
            out = build_transform(96, heavy=heavy, cheaper=cheaper, uint8=uint8)(image)
            assert out.shape == (3, 96, 96) and out.dtype == dtype, (cheaper, uint8)
        # after the fast data path's folder has decoded, cropped and flipped
        out = build_transform(96, heavy=heavy, uint8=uint8, cropped=True)(torch.zeros(3, 96, 96, dtype=torch.uint8))
        assert out.shape == (3, 96, 96) and out.dtype == dtype, uint8
