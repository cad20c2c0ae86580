"""A library call belongs to one stage, and what is said of it follows (issue 43, case 6): a recommendation cites
only calls of its own stage, and a call's time is never more than its stage's.

The demo's "Make the augmentations cheaper" cited ``Image.convert`` and ``PIL.Image.open`` (torchvision's loader
decoding the JPEG, not augmenting it), and ``Image.convert``'s 1.79 s was more than the transform stage's 1.65 s.
"""

from __future__ import annotations

import dataclasses

import pytest
from PIL import Image

from stallscope.analysis import analyze
from stallscope.analysis.pipeline import call_nodes, calls_in_step_time
from stallscope.recorder import calls, stacks
from stallscope.recorder.libraries import patch_pil_image, patch_pil_imagefile
from stallscope.render import words
from stallscope.session import FetchRecord
from tests.unit.test_analysis_steps import MS, PID, make_session, nxt, opt

#: One batch of 4 images as torchvision's ImageFolder makes it: open and convert (the decode) in its loader, then
#: the transforms. Image.convert is the costliest call, and a decode call.
CALLS = {"PIL.Image.open": (4, "decode"), "Image.convert": (30, "decode"), "RandomResizedCrop": (20, "transform"),
         "ToTensor": (8, "transform"), "Normalize": (3, "transform"), "collate": (1, "loader")}


def _fetch(seq: int, with_nodes: bool = True, blocked_ms: int = 0) -> FetchRecord:
    by_name: dict[str, list] = {}
    by_node: dict[str, list[int]] = {}
    for name, (ms, node) in CALLS.items():
        wall = ms * MS + seq * 1000 + len(name)  # distinct sums, as measured times are
        # the decode's file read blocks: wall time off the CPU, which the stage split charges to storage
        wall += blocked_ms * MS if name == "PIL.Image.open" else 0
        cpu = ms * MS + seq * 1000 + len(name)
        count = 1 if name == "collate" else 4
        by_name[name] = [wall, cpu, count, node] if with_nodes else [wall, cpu, count]
        row = by_node.setdefault(node, [0, 0, 0])
        row[0] += wall
        row[1] += cpu
        row[2] += count
    cpu = sum(r[1] for r in by_node.values()) + 2 * MS  # 2 ms of the dataset's own Python
    start = 100 * seq * MS
    return FetchRecord(0, 0, -1, seq, start, start + cpu + blocked_ms * MS, cpu, 0, 4, by_node, by_name, None, PID)


def _session(with_nodes: bool = True, blocked_ms: int = 0, untimed: int = 0):
    """Input-bound, num_workers=0: each step waits 70 ms for its batch, then computes for 30 ms."""
    nexts = [nxt(100 * k, 100 * k + 70) for k in range(12)]
    opts = [opt(100 * k + 95, 100 * k + 100) for k in range(12)]
    fetches = [_fetch(k, with_nodes, blocked_ms) for k in range(12)]
    # some batches' calls not timed (the recorder times one batch in every few where calls are cheap)
    fetches = [dataclasses.replace(f, by_node={}, by_name={}, timed=False) if 0 < k <= untimed else f
               for k, f in enumerate(fetches)]
    return make_session(nexts, opts, fetches=fetches)


@pytest.mark.parametrize("with_nodes", [True, False], ids=["recorded", "recorded-before-calls-had-nodes"])
def test_the_cheaper_transforms_advice_cites_transform_calls_only(with_nodes: bool) -> None:
    analysis = analyze(_session(with_nodes))
    [advice] = [r for r in analysis.recommendations if r.id == "cheaper-transforms"]
    cited = advice.facts["costliest_calls"]
    assert cited == ["RandomResizedCrop", "ToTensor", "Normalize"]
    assert "Image.convert" not in words.recommendation(advice).reason


def test_the_node_of_each_call_is_read_from_the_record_or_from_its_fetch_totals() -> None:
    expected = {name: node for name, (_, node) in CALLS.items()}
    assert call_nodes([_fetch(k) for k in range(3)]) == expected
    assert call_nodes([_fetch(k, with_nodes=False) for k in range(3)]) == expected


@pytest.mark.parametrize("blocked_ms,untimed", [(0, 0), (40, 0), (0, 8), (40, 8)])
def test_no_call_costs_more_than_its_stage(blocked_ms: int, untimed: int) -> None:
    """A call that blocks (its read waits on storage) and batches whose calls were not timed: the worker seconds a
    call is given stay within its stage's, and so do the step seconds shown beside the stages."""
    analysis = analyze(_session(blocked_ms=blocked_ms, untimed=untimed))
    pipeline = analysis.train_loader.pipeline
    for name, seconds in pipeline.by_call.items():
        node = pipeline.call_node[name]
        assert seconds <= pipeline.node_s[node] + 1e-12, (name, seconds, node, pipeline.node_s)
    calls_of_step = calls_in_step_time(pipeline, analysis.node_seconds)
    assert {name for name, _, _ in calls_of_step} == set(CALLS)
    for name, node, seconds in calls_of_step:
        assert seconds <= analysis.node_seconds[node] + 1e-12, (name, seconds, node, analysis.node_seconds)
    decode_calls = sum(s for _, node, s in calls_of_step if node == "decode")
    assert decode_calls <= analysis.node_seconds["decode"] + 1e-12


@pytest.fixture
def patched_pil():
    """Pillow as the recorder patches it, put back afterwards."""
    from PIL import ImageFile

    saved = [(Image, "open", Image.open), (ImageFile.ImageFile, "load", vars(ImageFile.ImageFile)["load"])]
    saved += [(Image.Image, name, value) for name, value in list(vars(Image.Image).items()) if callable(value)]
    patch_pil_image(Image)
    patch_pil_imagefile(ImageFile)
    try:
        yield
    finally:
        calls.end_fetch()
        for owner, name, value in saved:
            setattr(owner, name, value)


def test_converting_an_image_that_is_still_to_decode_is_decode_and_a_decoded_one_transform(patched_pil,
                                                                                         tmp_path) -> None:
    """torchvision's loader converts right after open: that convert decodes the JPEG (decode). A transform that
    converts an image already decoded converts pixels (transform)."""
    path = tmp_path / "a.jpg"
    Image.new("RGB", (64, 48), (200, 10, 10)).save(path)
    account = calls.begin_fetch()
    with open(path, "rb") as f:
        image = Image.open(f).convert("RGB")  # torchvision's pil_loader
    image.convert("L")  # a transform's
    calls.end_fetch()
    nodes = {name: row[3] for name, row in account.by_name.items()}
    assert nodes["Image.convert"] == "decode"
    assert nodes[calls.DECODED_CONVERT] == "transform"
    assert account.by_node["decode"][2] == 2 and account.by_node["transform"][2] == 1  # open, convert; convert


def test_a_sample_inside_a_convert_is_of_the_stage_that_convert_was_timed_in(patched_pil, tmp_path) -> None:
    """The sampled stack's stage is read from the innermost timed call: for a convert, the node it was timed in."""
    import sys

    path = tmp_path / "b.jpg"
    Image.new("RGB", (32, 32)).save(path)
    seen: list[str | None] = []

    def look(frame, event, arg):
        if event == "call" and frame.f_code.co_name == "convert" and frame.f_back is not None:
            seen.append(stacks.stack_of(frame)[0])

    calls.begin_fetch()
    loaded = Image.open(path)
    loaded.load()
    pending = Image.open(path)
    sys.setprofile(look)
    try:
        pending.convert("RGB")
        loaded.convert("L")
    finally:
        sys.setprofile(None)
        calls.end_fetch()
    assert seen == ["decode", "transform"]


@pytest.mark.parametrize("blocked_ms", [0, 40])
def test_the_evidence_gives_each_costliest_call_no_more_than_its_stage(blocked_ms: int) -> None:
    """The evidence's "costliest calls" shares are of step time, each with its stage, as the stage table's are: the
    demo said "Image.convert 34%" (of the loading's busy time) beside "decode 29%" (of step time)."""
    import re

    analysis = analyze(_session(blocked_ms=blocked_ms))
    [line] = [e for e in words.evidence(analysis) if "costliest calls" in e]
    cited = re.findall(r"([\w.() ]+?) (\d+)% \((\w+)\)", line.split("costliest calls", 1)[1])
    assert [name.strip(" ,:") for name, _, _ in cited][:1] == ["Image.convert"], line
    total = sum(analysis.node_seconds.values())
    for name, percent, stage in cited:
        assert stage == CALLS[name.strip(" ,:")][1]
        assert int(percent) <= round(100 * analysis.node_seconds[stage] / total), (line, analysis.node_seconds)
