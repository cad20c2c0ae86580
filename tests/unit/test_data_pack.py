"""pack() and verify(): round trip, checksums, bad inputs named, resume equals an uninterrupted pack."""

from __future__ import annotations

import io
import shutil
from pathlib import Path

import pytest
from PIL import Image

from stallscope.data import PackError, PackedImageDataset, PackFormatError, PackOptions, load_index, pack, verify
from stallscope.data.index import INDEX_NAME
from stallscope.data.sources import SourceError, open_source
from stallscope.demo.dataset import DatasetSpec, make_dataset

pytest.importorskip("lmdb")


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    return make_dataset(tmp_path_factory.mktemp("src") / "imgs", DatasetSpec(n_files=48, width=200, height=160))


@pytest.fixture()
def bad_source(tmp_path, source):
    """A class folder with a few good images and every kind of bad file."""
    root = tmp_path / "bad"
    good = sorted((source / "class_00").glob("*.jpg"))[:3]
    (root / "a").mkdir(parents=True)
    for path in good:
        shutil.copy(path, root / "a" / path.name)
    data = good[0].read_bytes()
    (root / "a" / "truncated.jpg").write_bytes(data[: len(data) // 3])
    (root / "a" / "zero.jpg").write_bytes(b"")
    (root / "a" / "notes.jpg").write_text("this is a text file\n")
    Image.new("RGB", (40, 30), (200, 10, 10)).save(root / "a" / "drawing.png")
    (root / "a" / "dangling.jpg").symlink_to(tmp_path / "does-not-exist")
    return root


def _records(path: Path) -> list[tuple[bytes, int]]:
    ds = PackedImageDataset(path)
    return [ds.raw(i) for i in range(len(ds))]


@pytest.mark.parametrize("fmt", ["lmdb", "wds"])
def test_round_trip_bytes_and_labels_match_the_source(source, tmp_path, fmt):
    out = tmp_path / f"pack-{fmt}"
    result = pack(source, out, PackOptions(format=fmt, shard_size=10, workers=2))
    samples = open_source(source).samples
    assert result.records == len(samples) and not result.skipped
    assert _records(out) == [(p.read_bytes(), label) for p, label in samples]
    assert verify(out).ok
    assert not out.with_name(out.name + ".partial").exists()
    if fmt == "wds":
        assert len(load_index(out).shards) == 5


@pytest.mark.parametrize("fmt", ["lmdb", "wds"])
def test_verify_catches_a_flipped_byte(source, tmp_path, fmt):
    out = tmp_path / f"pack-{fmt}"
    pack(source, out, PackOptions(format=fmt, shard_size=100))
    index = load_index(out)
    victim = index.records[17]
    target = out / ("data.mdb" if fmt == "lmdb" else index.shards[0])
    blob = bytearray(target.read_bytes())
    if fmt == "wds":
        positions = [victim.offset + victim.size // 2]
    else:
        # The record's bytes can also sit in freed copy-on-write pages of data.mdb: flip every copy.
        needle = PackedImageDataset(out).raw(17)[0][-300:-200]
        positions, start = [], 0
        while (found := blob.find(needle, start)) >= 0:
            positions.append(found + 10)
            start = found + 1
        assert positions
    for pos in positions:
        blob[pos] ^= 0x01
    target.write_bytes(bytes(blob))
    result = verify(out)
    assert not result.ok
    assert any(victim.key in e and victim.source in e for e in result.errors)


def test_bad_inputs_are_named_and_skipped(bad_source, tmp_path):
    result = pack(bad_source, tmp_path / "out", PackOptions(format="lmdb"))
    skipped = {p.source: p.kind for p in result.skipped}
    assert skipped == {"a/truncated.jpg": "corrupt", "a/zero.jpg": "empty", "a/notes.jpg": "not-an-image",
                       "a/dangling.jpg": "unreadable"}
    assert {p.source: p.kind for p in result.warnings} == {"a/drawing.png": "not-jpeg"}
    assert result.records == 4  # three JPEGs and the PNG
    assert {p.source for p in load_index(tmp_path / "out").problems} == set(skipped) | {"a/drawing.png"}
    assert PackedImageDataset(tmp_path / "out")[3][0].shape[0] == 3


def test_strict_stops_and_writes_nothing(bad_source, tmp_path):
    out = tmp_path / "out"
    with pytest.raises(PackError, match="dangling.jpg|notes.jpg|truncated.jpg|zero.jpg"):
        pack(bad_source, out, PackOptions(format="wds", strict=True))
    assert not out.exists() and not out.with_name("out.partial").exists()


class _Crash(Exception):
    pass


@pytest.mark.parametrize("fmt", ["lmdb", "wds"])
def test_interrupted_pack_resumes_to_the_same_result(source, tmp_path, fmt):
    options = PackOptions(format=fmt, shard_size=8, commit_every=8)
    clean = tmp_path / "clean"
    pack(source, clean, options)

    def crash_after_30(done: int, total: int, nbytes: int) -> None:
        if done == 30:
            raise _Crash

    resumed = tmp_path / "resumed"
    with pytest.raises(_Crash):
        pack(source, resumed, options, progress=crash_after_30)
    assert not resumed.exists() and resumed.with_name("resumed.partial").exists()
    result = pack(source, resumed, options)
    assert 0 < result.resumed_at <= 30
    assert verify(resumed).ok
    assert load_index(resumed).digest == load_index(clean).digest
    assert _records(resumed) == _records(clean)
    if fmt == "wds":  # tar shards are byte-identical, not just equal in content
        for name in load_index(clean).shards:
            assert (resumed / name).read_bytes() == (clean / name).read_bytes()


LEAVE_EARLY = """
import sys
from pathlib import Path
from stallscope.data.packing.packer import _prepared_stream

files = sorted(Path(sys.argv[1]).rglob("*.jpg"))
tasks = [(i, str(p), p.name, 0, 0, 90) for i, p in enumerate(files)]
for leave in range(30):
    stream = _prepared_stream(tasks, 2)
    for k, item in enumerate(stream):
        if k == 3 + leave % 20:
            break
    stream.close()
print("left 30 times")
"""


def test_leaving_the_prepared_stream_early_never_hangs(tmp_path):
    """A pack that fails part-way (a full disk) leaves its workers' stream with chunks still on their way, each more
    than a pipe holds. Pool.terminate() stopped the pool's result reader first, so a worker sending one kept the
    result queue's lock for ever and terminate waited on it: 4 runs of 40 early leaves in 5 hung. A race, so this
    leaves 30 times on 160 photos of 500x400 (chunks of 16, about 400 KB), in a child that a hang times out."""
    import os
    import signal
    import subprocess
    import sys

    photos = make_dataset(tmp_path / "photos", DatasetSpec(n_files=160, width=500, height=400))
    child = subprocess.Popen([sys.executable, "-c", LEAVE_EARLY, str(photos)], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = child.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        os.killpg(child.pid, signal.SIGKILL)  # the child and its pool's workers, which a hang leaves waiting
        child.communicate()
        pytest.fail("leaving the prepared stream early hung")
    assert child.returncode == 0 and "left 30 times" in out, err[-2000:]


def test_rerun_of_a_finished_pack_is_a_no_op_and_conflicts_are_refused(source, tmp_path):
    out = tmp_path / "out"
    first = pack(source, out, PackOptions())
    again = pack(source, out, PackOptions(workers=2))
    assert again.already_complete and again.digest == first.digest
    with pytest.raises(PackError, match="--force"):
        pack(source, out, PackOptions(max_side=64))
    assert pack(source, out, PackOptions(max_side=64), force=True).records == first.records


def _tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_force_never_deletes_a_folder_holding_the_source(source, tmp_path):
    """The reported case: ``pack dir/src dir --force`` removed ``dir`` (images and unrelated files)."""
    folder = tmp_path / "dir"
    shutil.copytree(source, folder / "src")
    (folder / "notes.txt").write_text("mine")
    before = _tree(folder)
    for out in (folder, tmp_path):  # OUT is the source's parent, or further up
        with pytest.raises(PackError, match="contains the source"):
            pack(folder / "src", out, PackOptions(), force=True)
    work_like = tmp_path / "x.partial"  # OUT's work folder (OUT.partial) holding the source
    shutil.copytree(source, work_like / "src")
    with pytest.raises(PackError, match="contains the source"):
        pack(work_like / "src", tmp_path / "x", PackOptions(), force=True)
    assert (work_like / "src").is_dir()
    with pytest.raises(PackError, match="inside the source"):
        pack(folder / "src", folder / "src" / "packed", PackOptions(), force=True)
    assert _tree(folder) == before


@pytest.mark.parametrize("content", ["foreign-file", "foreign-pack-and-file", "plain-file", "partial"])
def test_force_replaces_only_what_pack_wrote(source, tmp_path, content):
    out = tmp_path / "out"
    if content == "foreign-file":  # a folder of the user's that happens to be named like OUT
        out.mkdir()
        (out / "results.csv").write_text("keep me")
    elif content == "foreign-pack-and-file":  # a real pack, with a file the user added beside it
        pack(source, out, PackOptions(max_side=64))
        (out / "README").write_text("keep me")
    elif content == "plain-file":
        out.write_text("keep me")
    else:  # a folder named like the packer's work folder, not made by it
        work = tmp_path / "out.partial"
        work.mkdir()
        (work / "state.txt").write_text("keep me")
    before = _tree(tmp_path)
    with pytest.raises(PackError, match="not (a finished|an unfinished) pack made by stallscope pack"):
        pack(source, out, PackOptions(), force=True)
    assert _tree(tmp_path) == before


def test_max_side_reencodes_large_images(source, tmp_path):
    out = tmp_path / "small"
    pack(source, out, PackOptions(max_side=100, quality=80))
    index = load_index(out)
    assert all(max(r.width, r.height) <= 100 and r.ext == "jpg" for r in index.records)
    data, _ = PackedImageDataset(out).raw(0)
    assert max(Image.open(io.BytesIO(data)).size) <= 100


def test_file_list_source(source, tmp_path):
    samples = open_source(source).samples[:6]
    listing = tmp_path / "files.csv"
    listing.write_text("".join(f"{p},{label}\n" for p, label in samples))
    out = tmp_path / "out"
    result = pack(listing, out, PackOptions(format="wds"))
    assert result.records == 6
    assert _records(out) == [(p.read_bytes(), label) for p, label in samples]


def test_webdataset_library_reads_the_shards(source, tmp_path):
    wds = pytest.importorskip("webdataset")
    out = tmp_path / "shards"
    pack(source, out, PackOptions(format="wds", shard_size=20))
    index = load_index(out)
    urls = [str(out / name) for name in index.shards]
    seen = [(s["__key__"], s["jpg"], int(s["cls"])) for s in wds.WebDataset(urls, shardshuffle=False)]
    assert [(r.key, r.label) for r in index.records] == [(k, c) for k, _, c in seen]
    assert all(len(b) == r.size for (_, b, _), r in zip(seen, index.records))


def test_errors_for_missing_or_unfinished_packs(tmp_path, source):
    with pytest.raises(SourceError):
        pack(tmp_path / "nothing", tmp_path / "out")
    with pytest.raises(PackError, match="unknown format"):
        pack(source, tmp_path / "out", PackOptions(format="zip"))
    with pytest.raises(PackError, match="--commit-every must be at least 1"):
        pack(source, tmp_path / "out", PackOptions(commit_every=0))
    with pytest.raises(PackError, match="--workers must be between 0 .* and 1024"):
        pack(source, tmp_path / "out", PackOptions(workers=100_000))
    (tmp_path / "half").mkdir()
    with pytest.raises(PackFormatError, match=INDEX_NAME):
        verify(tmp_path / "half")
    with pytest.raises(PackFormatError, match="no such pack"):
        PackedImageDataset(tmp_path / "absent")


def test_progressive_jpegs_are_stored_sequential_with_the_same_pixels(tmp_path):
    """A progressive JPEG costs its decoder 2-3x a sequential one's time: the pack rewrites it losslessly (the
    same DCT coefficients), so every decoder gives the same pixels from the stored bytes as from the source."""
    import numpy as np

    from stallscope.data.headers import jpeg_is_progressive
    from stallscope.data.turbo import turbojpeg_library

    if turbojpeg_library() is None:
        pytest.skip("no TurboJPEG 3 library (the 'turbo' extra)")
    photos = make_dataset(tmp_path / "photos", DatasetSpec(n_files=6, width=320, height=240))
    root = tmp_path / "src"
    (root / "a").mkdir(parents=True)
    for i, path in enumerate(sorted(photos.glob("*/*.jpg"))):
        with Image.open(path) as im:
            im.save(root / "a" / f"{i}.jpg", quality=88, progressive=i % 2 == 0,
                    subsampling=0 if i == 2 else 2)  # one progressive 4:4:4 too
    result = pack(root, tmp_path / "pack", PackOptions(format="wds"))
    assert result.baseline == 3
    sources = open_source(root).samples
    for (stored, _), (path, _) in zip(_records(tmp_path / "pack"), sources):
        original = path.read_bytes()
        assert not jpeg_is_progressive(stored)
        assert (stored == original) != jpeg_is_progressive(original)
        with Image.open(io.BytesIO(stored)) as a, Image.open(io.BytesIO(original)) as b:
            assert np.array_equal(np.asarray(a.convert("RGB")), np.asarray(b.convert("RGB")))
    assert verify(tmp_path / "pack").ok
