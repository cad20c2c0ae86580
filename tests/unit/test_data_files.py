"""Reading user data by path (issue 43, case 3): only regular files, never more than their size, never a wait.

Everything is real: ``/dev/zero`` and ``/dev/urandom``, FIFOs from ``os.mkfifo``, a bound Unix socket, links.
Where a regression would read a device to its end, the code runs in a child whose data segment is capped
(RLIMIT_DATA), so it fails with a MemoryError instead of eating the machine; where it would wait on a FIFO, the
child has a timeout.
"""

from __future__ import annotations

import io
import json
import os
import socket
from pathlib import Path

import pytest
from PIL import Image

from tests.capped import capped_python

needs_fifo = pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")


def run_capped(code: str, timeout: float = 120) -> dict:
    """Run ``code`` in a Python child with its memory capped and a deadline (``tests/capped.py``); the JSON it
    prints last."""
    done = capped_python(code, timeout=timeout)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def _jpeg(width: int = 64, height: int = 48) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (width, height), (200, 40, 90)).save(buf, format="JPEG")
    return buf.getvalue()


def _socket_file(path: Path) -> None:
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(str(path))
    listener.close()  # the socket file stays


# --- the helper itself


def test_a_regular_file_is_read_whole_or_its_first_bytes(tmp_path: Path) -> None:
    from stallscope.data.files import not_regular, read_regular

    (tmp_path / "a.jpg").write_bytes(b"0123456789")
    assert read_regular(tmp_path / "a.jpg") == b"0123456789"
    assert read_regular(tmp_path / "a.jpg", limit=4) == b"0123"
    assert read_regular(tmp_path / "a.jpg", limit=99) == b"0123456789"
    assert not_regular(tmp_path / "a.jpg") is None
    os.symlink(tmp_path / "a.jpg", tmp_path / "link.jpg")  # a link to a regular file is one
    assert read_regular(tmp_path / "link.jpg") == b"0123456789"


def test_devices_are_refused_without_being_read() -> None:
    found = run_capped(
        "import json\n"
        "from stallscope.data.files import read_regular, NotRegularFileError\n"
        "out = {}\n"
        "for path in ('/dev/zero', '/dev/urandom', '/dev/null'):\n"
        "    try:\n"
        "        read_regular(path)\n"
        "        out[path] = 'read'\n"
        "    except NotRegularFileError as exc:\n"
        "        out[path] = exc.strerror\n"
        "print(json.dumps(out))\n")
    assert found == {path: "not a regular file: character device" for path in ("/dev/zero", "/dev/urandom",
                                                                               "/dev/null")}


@needs_fifo
@pytest.mark.timeout(60)
def test_a_fifo_nobody_writes_to_is_refused_at_once(tmp_path: Path) -> None:
    from stallscope.data.files import NotRegularFileError, not_regular, open_regular, read_regular

    os.mkfifo(tmp_path / "pipe.jpg")
    with pytest.raises(NotRegularFileError, match="not a regular file: FIFO"):
        read_regular(tmp_path / "pipe.jpg")
    with pytest.raises(NotRegularFileError):
        open_regular(tmp_path / "pipe.jpg")
    assert not_regular(tmp_path / "pipe.jpg") == "not a regular file: FIFO"


def test_sockets_folders_and_links_to_devices_are_refused(tmp_path: Path) -> None:
    from stallscope.data.files import NotRegularFileError, describe, not_regular, read_regular

    _socket_file(tmp_path / "socket.jpg")
    (tmp_path / "folder.jpg").mkdir()
    os.symlink("/dev/zero", tmp_path / "zero.jpg")
    expected = {"socket.jpg": "not a regular file: socket", "folder.jpg": "not a regular file: directory",
                "zero.jpg": "not a regular file: character device (a link to /dev/zero)"}
    for name, reason in expected.items():
        with pytest.raises(NotRegularFileError) as caught:
            read_regular(tmp_path / name)
        assert describe(caught.value) == reason and not_regular(tmp_path / name) == reason
        assert caught.value.filename == str(tmp_path / name)


def test_dangling_links_and_link_loops_fail_as_unreadable(tmp_path: Path) -> None:
    from stallscope.data.files import describe, not_regular, read_regular

    os.symlink(tmp_path / "nothing.jpg", tmp_path / "dangling.jpg")
    os.symlink(tmp_path / "loop.jpg", tmp_path / "loop.jpg")
    with pytest.raises(FileNotFoundError):
        read_regular(tmp_path / "dangling.jpg")
    with pytest.raises(OSError) as caught:
        read_regular(tmp_path / "loop.jpg")
    assert describe(caught.value) == "OSError: Too many levels of symbolic links"
    assert not_regular(tmp_path / "dangling.jpg") is None  # reading it says what is wrong


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="needs /proc")
def test_a_file_whose_size_says_less_than_it_holds_is_refused_after_one_byte() -> None:
    """/proc files are regular, say 0 bytes, and make up content when read: the read stops one byte past the
    size (a file that grows while being read looks the same), and says so."""
    from stallscope.data.files import FileChangedError, read_regular

    with pytest.raises(FileChangedError, match="its size was 0 bytes when opened, and it held more"):
        read_regular("/proc/self/status")
    assert read_regular("/proc/self/status", limit=512) == b""  # a header read takes what the size allows


# --- the places that read user data by path


@needs_fifo
def test_fast_image_folder_leaves_out_and_names_what_is_not_a_regular_file(tmp_path: Path) -> None:
    """The ImageFolder scan once dropped a link to a device named *.jpg without a word."""
    for cls in ("a", "b"):
        (tmp_path / "root" / cls).mkdir(parents=True)
        (tmp_path / "root" / cls / "1.jpg").write_bytes(_jpeg())
    os.symlink("/dev/zero", tmp_path / "root" / "a" / "zero.jpg")
    os.mkfifo(tmp_path / "root" / "b" / "pipe.jpg")
    listing = tmp_path / "list.csv"
    listing.write_text(f"{tmp_path}/root/a/1.jpg,0\n/dev/urandom,1\n")
    found = run_capped(
        "import json, sys, warnings\n"
        "from stallscope.data import FastImageFolder\n"
        f"root, listing = {str(tmp_path / 'root')!r}, {str(listing)!r}\n"
        "with warnings.catch_warnings(record=True) as caught:\n"
        "    warnings.simplefilter('always')\n"
        "    folder = FastImageFolder(root)\n"
        "    listed = FastImageFolder.from_file_list(listing)\n"
        "items = [tuple(folder[i][0].shape) for i in range(len(folder))]\n"
        "print(json.dumps({'samples': [s for s, _ in folder.samples], 'listed': [s for s, _ in listed.samples],\n"
        "                  'items': items, 'warnings': [str(w.message) for w in caught]}))\n", timeout=180)
    assert found["samples"] == [f"{tmp_path}/root/a/1.jpg", f"{tmp_path}/root/b/1.jpg"]
    assert found["listed"] == [f"{tmp_path}/root/a/1.jpg"]
    assert len(found["items"]) == 2
    folder_warning, list_warning = found["warnings"]
    assert "left out 2 path(s)" in folder_warning
    assert f"{tmp_path}/root/a/zero.jpg: not a regular file: character device (a link to /dev/zero)" in folder_warning
    assert f"{tmp_path}/root/b/pipe.jpg: not a regular file: FIFO" in folder_warning
    assert "left out 1 path(s)" in list_warning and "/dev/urandom: not a regular file: character device" in list_warning


@needs_fifo
@pytest.mark.timeout(60)
def test_a_sample_that_became_a_fifo_after_listing_fails_at_once(tmp_path: Path) -> None:
    from stallscope.data import FastImageFolder

    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "1.jpg").write_bytes(_jpeg())
    dataset = FastImageFolder(tmp_path)
    (tmp_path / "a" / "1.jpg").unlink()
    os.mkfifo(tmp_path / "a" / "1.jpg")
    with pytest.raises(OSError, match="not a regular file: FIFO") as caught:
        dataset[0]
    assert caught.value.filename == str(tmp_path / "a" / "1.jpg")


@pytest.mark.timeout(60)
def test_image_folder_listing_keeps_odd_files_for_pack_to_name_and_does_not_follow_loops(tmp_path: Path) -> None:
    from stallscope.data.sources import list_image_folder

    (tmp_path / "a" / "deep").mkdir(parents=True)
    (tmp_path / "a" / "deep" / "1.jpg").write_bytes(_jpeg())
    os.symlink("/dev/zero", tmp_path / "a" / "zero.jpg")
    for n in range(3):  # three loops a level: followed, the listing would never end
        os.symlink("..", tmp_path / "a" / "deep" / f"up{n}")
        os.symlink(".", tmp_path / "a" / "deep" / f"here{n}")
        os.symlink(tmp_path, tmp_path / "a" / f"root{n}")
    source = list_image_folder(tmp_path)
    assert [p.relative_to(tmp_path).as_posix() for p, _ in source.samples] == ["a/zero.jpg", "a/deep/1.jpg"]


@needs_fifo
def test_doctor_names_files_that_are_not_regular_and_never_reads_one(tmp_path: Path) -> None:
    from stallscope.health.dataset import check_files
    from stallscope.health.dataset_scan import decode_sample, walk

    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "1.jpg").write_bytes(_jpeg())
    os.mkfifo(tmp_path / "a" / "pipe.jpg")
    _socket_file(tmp_path / "a" / "socket.jpg")
    os.symlink("/dev/zero", tmp_path / "a" / "zero.jpg")
    facts = walk(str(tmp_path))
    assert [Path(p).name for p, _ in facts.files] == ["1.jpg"]
    assert [(Path(p).name, why) for p, why in facts.not_regular] == [
        ("pipe.jpg", "not a regular file: FIFO"), ("socket.jpg", "not a regular file: socket"),
        ("zero.jpg", "not a regular file: character device (a link to /dev/zero)")]
    check = check_files(facts)
    assert check.status == "warn" and "3 not regular file(s) left out" in check.value and "pipe.jpg" in check.value
    assert [item["path"] for item in check.data["not_regular"]] == [p for p, _ in facts.not_regular]
    facts.image_sampled = [str(tmp_path / "a" / "pipe.jpg")]  # a file that became a FIFO after the walk
    decode_sample(facts)
    assert facts.decode_failures == [(str(tmp_path / "a" / "pipe.jpg"), "not a regular file: FIFO")]


def test_doctor_decode_sample_does_not_read_a_device_to_its_end(tmp_path: Path) -> None:
    found = run_capped(
        "import json\n"
        "from stallscope.health.dataset_scan import DatasetFacts, decode_sample, read_headers\n"
        "facts = DatasetFacts(root='/dev', files=[('/dev/zero', 0)], image_sampled=['/dev/zero'])\n"
        "read_headers(facts)\n"
        "decode_sample(facts)\n"
        "print(json.dumps({'formats': dict(facts.formats), 'failures': facts.decode_failures}))\n")
    assert found == {"formats": {"unreadable": 1}, "failures": [["/dev/zero", "not a regular file: character device"]]}


@needs_fifo
def test_decoder_race_names_devices_and_fifos_and_races_the_rest(tmp_path: Path) -> None:
    """``bench --decoders DIR`` read every *.jpg to its end: a link to /dev/zero filled memory, a FIFO hung it."""
    folder = tmp_path / "jpegs"
    folder.mkdir()
    (folder / "a_good.jpg").write_bytes(_jpeg(80, 60))
    os.symlink("/dev/zero", folder / "b_zero.jpg")
    os.mkfifo(folder / "c_pipe.jpg")
    found = run_capped(
        "import json\n"
        "from stallscope.tuning.decoders import race_decoders\n"
        f"race = race_decoders({str(folder)!r}, files=10, repeats=1, min_seconds=0.01, timeout_s=100)\n"
        "print(json.dumps({'files': race.files, 'skipped': race.skipped}))\n", timeout=150)
    assert found["files"] == 1
    assert found["skipped"] == [
        {"path": str(folder / "b_zero.jpg"), "error": "not a regular file: character device (a link to /dev/zero)"},
        {"path": str(folder / "c_pipe.jpg"), "error": "not a regular file: FIFO"}]


def test_a_file_list_that_is_not_a_regular_file_is_a_clear_source_error(tmp_path: Path) -> None:
    from stallscope.data.sources import SourceError, open_source, read_file_list

    with pytest.raises(SourceError, match="/dev/zero: not a regular file: character device"):
        open_source("/dev/zero")
    (tmp_path / "dir.csv").mkdir()
    with pytest.raises(SourceError, match="cannot read this file list \\(not a regular file: directory\\)"):
        read_file_list(tmp_path / "dir.csv")
    with pytest.raises(SourceError, match="no such file list"):
        read_file_list(tmp_path / "missing.csv")
