"""``bench --decoders``: stallscope's TurboJPEG 3 binding races at full size, at each DCT scale and on a crop.

The JPEGs are cut from a real photo (scikit-image's astronaut) so the decoders do a photo's entropy
decoding, at an odd size so the scaled sizes round up. No wall-clock thresholds: a rate only has to
be measured (positive), never fast.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from PIL import Image
from rich.console import Console

from stallscope.data import turbo
from stallscope.data.cropdecode import scaled_box
from stallscope.tuning.decoders import (
    SCALES,
    _contenders,
    crop_plan,
    crop_scale,
    race_decoders,
)

WIDTH, HEIGHT = 1203, 901  # the crop's region is 851x637: 1/2 keeps it over 224 px, 1/4 would not

needs_turbo = pytest.mark.skipif(turbo.turbojpeg_library() is None,
                                 reason="no libjpeg-turbo 3 TurboJPEG library (extra 'turbo')")


def _jpeg(width: int = WIDTH, height: int = HEIGHT, quality: int = 90) -> bytes:
    import skimage.data

    image = Image.fromarray(skimage.data.astronaut()).resize((width, height), Image.BILINEAR)
    buf = io.BytesIO()
    image.save(buf, format="JPEG", quality=quality)  # Pillow's default layout, 4:2:0
    return buf.getvalue()


def _turbo_rows(sizes: list[tuple[int, int]]) -> dict[tuple[str, int], object]:
    return {(name, scale): fn for name, scale, fn in _contenders(sizes) if name.startswith("turbojpeg")}


def test_crop_plan_is_the_centred_half_of_the_area() -> None:
    plan = crop_plan(2000, 1500)
    assert (plan.width, plan.height) == (1414, 1061)
    assert (plan.left, plan.top) == ((2000 - 1414) // 2, (1500 - 1061) // 2)
    assert plan.width * plan.height == pytest.approx(2000 * 1500 / 2, rel=0.002)
    assert (plan.out_width, plan.out_height) == (224, 224)


@pytest.mark.parametrize("sizes,scale", [
    ([(2000, 1500)], 4),  # 1414x1061: 1/4 is 353x265, 1/8 would be 176 px wide
    ([(WIDTH, HEIGHT)], 2),
    ([(500, 400)], 1),  # 354x283: 1/2 would be 141 px high
    ([(2000, 1500), (500, 400)], 1),  # one scale for the row: the smallest the files need
])
def test_crop_scale_keeps_every_region_at_least_224_px(sizes, scale) -> None:
    assert crop_scale(sizes) == scale
    for w, h in sizes:
        plan = crop_plan(w, h)
        assert min(plan.width // scale, plan.height // scale) >= 224


@needs_turbo
def test_turbojpeg_rows_decode_the_size_of_their_scale() -> None:
    data = _jpeg()
    rows = _turbo_rows([(WIDTH, HEIGHT)])
    crop_name = "turbojpeg-fast crop (centre, 50% of area)"
    expected = {(name, s) for name in ("turbojpeg-fast", "turbojpeg") for s in (1, *SCALES)} | {(crop_name, 2)}
    assert set(rows) == expected
    for (name, scale), fn in rows.items():
        pixels = fn(data, WIDTH, HEIGHT)
        if name == crop_name:
            x0, y0, x1, y1 = scaled_box(crop_plan(WIDTH, HEIGHT), WIDTH, HEIGHT, -(-WIDTH // scale),
                                        -(-HEIGHT // scale))
            # the region's rows exactly; its columns start and end up to an MCU (16 px at 4:2:0, 8 at 1/2) wider
            assert pixels.shape[0] == y1 - y0 and pixels.shape[2] == 3
            assert x1 - x0 <= pixels.shape[1] <= x1 - x0 + 2 * (16 // scale)
            assert min(pixels.shape[:2]) >= 224
        else:
            assert pixels.shape == (-(-HEIGHT // scale), -(-WIDTH // scale), 3), (name, scale)


def test_without_the_library_the_turbojpeg_rows_are_left_out(monkeypatch: pytest.MonkeyPatch) -> None:
    """As for every other missing library (simplejpeg, OpenCV, torchvision): no rows, no error."""
    monkeypatch.setattr(turbo, "turbojpeg_library", lambda: None)
    names = {name for name, _, _ in _contenders([(WIDTH, HEIGHT)])}
    assert not any(name.startswith("turbojpeg") for name in names)
    assert "pillow" in names


@needs_turbo
def test_race_measures_the_turbojpeg_rows(tmp_path: Path) -> None:
    from stallscope.render.bench import render_race

    folder = tmp_path / "jpegs"
    folder.mkdir()
    for i, quality in enumerate((80, 90, 95)):
        (folder / f"{i}.jpg").write_bytes(_jpeg(quality=quality))
    race = race_decoders(folder, files=3, repeats=1, min_seconds=0.01)
    doc = json.loads(json.dumps(race.to_dict()))
    assert doc["schema"] == "stallscope.decoder-race/1" and doc["files"] == 3
    rows = {(r["decoder"], r["scale"]): r for r in doc["results"]}
    pillow_keys = set(rows[("pillow", 1)])
    turbo_rows = {key: r for key, r in rows.items() if key[0].startswith("turbojpeg")}
    assert set(turbo_rows) == set(_turbo_rows([(WIDTH, HEIGHT)]))
    for key, row in turbo_rows.items():
        assert set(row) == pillow_keys, key  # the same JSON keys as every other row
        assert row["error"] is None and row["images_per_s"] > 0, key
    console = Console(file=io.StringIO(), width=200)
    render_race(race, console)
    table = console.file.getvalue()
    assert "turbojpeg-fast crop (centre, 50% of area)" in table and "turbojpeg-fast" in table


def test_race_leaves_out_files_pillow_cannot_decode_and_says_which(tmp_path: Path) -> None:
    from stallscope.render.bench import render_race

    folder = tmp_path / "jpegs"
    folder.mkdir()
    good = _jpeg(400, 300)
    (folder / "a_good.jpg").write_bytes(good)
    (folder / "b_empty.jpg").write_bytes(b"")
    (folder / "c_truncated.jpg").write_bytes(good[: len(good) // 2])
    (folder / "d_good.jpg").write_bytes(_jpeg(300, 400))
    race = race_decoders(folder, files=10, repeats=1, min_seconds=0.01)
    assert race.files == 2
    assert sorted(Path(item["path"]).name for item in race.skipped) == ["b_empty.jpg", "c_truncated.jpg"]
    assert race.megapixels == pytest.approx(0.12)
    pillow = next(r for r in race.results if r["decoder"] == "pillow" and r["scale"] == 1)
    assert pillow["error"] is None and pillow["images_per_s"] > 0
    assert json.loads(json.dumps(race.to_dict()))["skipped"] == race.skipped
    console = Console(file=io.StringIO(), width=300)
    render_race(race, console)
    assert "left out 2 file(s) that could not be decoded" in console.file.getvalue()


def test_race_on_no_decodable_file_or_no_folder_is_a_clear_error(tmp_path: Path) -> None:
    folder = tmp_path / "bad"
    folder.mkdir()
    (folder / "empty.jpg").write_bytes(b"")
    with pytest.raises(RuntimeError, match="none of the 1 JPEG files .* could be decoded"):
        race_decoders(folder, files=4, repeats=1, min_seconds=0.01)
    with pytest.raises(FileNotFoundError, match="no such folder"):
        race_decoders(tmp_path / "missing", files=4)
    with pytest.raises(FileNotFoundError, match="not a folder"):
        race_decoders(folder / "empty.jpg", files=4)
