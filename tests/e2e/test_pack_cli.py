"""``python -m stallscope pack`` in a subprocess: exit codes, bad files named, kill -9 then resume."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from stallscope.data import PackedImageDataset, load_index
from stallscope.demo.dataset import DatasetSpec, make_dataset
from stallscope.settings import ENV_PACK_THROTTLE
from tests.capped import capped_python

pytestmark = pytest.mark.e2e
pytest.importorskip("lmdb")


def stallscope(*args: str, env: dict[str, str] | None = None, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "stallscope", "pack", *args], capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, timeout=240, **kwargs)


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    return make_dataset(tmp_path_factory.mktemp("cli") / "src", DatasetSpec(n_files=60, width=200, height=160))


@pytest.mark.parametrize("fmt", ["lmdb", "wds"])
def test_pack_verify_and_flipped_byte(source, tmp_path, fmt):
    out = tmp_path / "out"
    done = stallscope(str(source), str(out), "--format", fmt, "--workers", "2", "--shard-size", "25",
                      "--report", str(tmp_path / "report.json"))
    assert done.returncode == 0, done.stderr
    assert json.loads((tmp_path / "report.json").read_text())["records"] == 60
    ok = stallscope("--verify", str(out))
    assert ok.returncode == 0 and "ok: 60 records" in ok.stdout
    index = load_index(out)
    rec = index.records[5]
    target = out / ("data.mdb" if fmt == "lmdb" else index.shards[0])
    blob = bytearray(target.read_bytes())
    needle = PackedImageDataset(out).raw(5)[0][-300:-200]
    pos = rec.offset + rec.size // 2 if fmt == "wds" else blob.find(needle) + 7
    blob[pos] ^= 0x40
    target.write_bytes(bytes(blob))
    bad = stallscope("--verify", str(out))
    assert bad.returncode == 1 and rec.key in bad.stdout and rec.source in bad.stdout


def test_corrupt_inputs_are_reported_by_name(source, tmp_path):
    from PIL import Image

    root = tmp_path / "src" / "cls"
    root.mkdir(parents=True)
    good = sorted((source / "class_01").glob("*.jpg"))[:2]
    for p in good:
        shutil.copy(p, root / p.name)
    (root / "truncated.jpg").write_bytes(good[0].read_bytes()[:900])
    (root / "empty.jpg").write_bytes(b"")
    (root / "readme.jpg").write_text("not an image\n")
    Image.new("RGB", (30, 20)).save(root / "icon.png")
    done = stallscope(str(tmp_path / "src"), str(tmp_path / "out"), "--workers", "0")
    assert done.returncode == 0, done.stderr
    for name in ("truncated.jpg", "empty.jpg", "readme.jpg", "icon.png"):
        assert f"cls/{name}" in done.stdout
    assert "skipped 3 bad file(s)" in done.stdout
    strict = stallscope(str(tmp_path / "src"), str(tmp_path / "strict"), "--strict")
    assert strict.returncode == 1 and "cls/" in strict.stderr and not (tmp_path / "strict").exists()


def test_usage_errors_exit_2(tmp_path, source):
    assert stallscope(str(tmp_path / "missing"), str(tmp_path / "out")).returncode == 2
    (tmp_path / "empty").mkdir()
    empty = stallscope(str(tmp_path / "empty"), str(tmp_path / "out"))
    assert empty.returncode == 2 and "no class folders" in empty.stderr
    assert stallscope(str(source), str(tmp_path / "out"), "--format", "zip").returncode == 2
    assert stallscope(str(source)).returncode == 2
    assert stallscope("--verify", str(tmp_path / "nowhere")).returncode == 2


@pytest.mark.parametrize("fmt", ["lmdb", "wds"])
def test_kill_9_mid_pack_then_resume_equals_uninterrupted(source, tmp_path, fmt):
    args = ["--format", fmt, "--workers", "2", "--commit-every", "5", "--shard-size", "5"]
    clean = tmp_path / "clean"
    assert stallscope(str(source), str(clean), *args).returncode == 0

    out = tmp_path / "killed"
    env = {**os.environ, ENV_PACK_THROTTLE: "0.1"}
    proc = subprocess.Popen([sys.executable, "-m", "stallscope", "pack", str(source), str(out), *args],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    state = out.with_name("killed.partial") / "state.json"
    deadline = time.monotonic() + 120  # a guard against hanging, not a timing assertion
    try:
        while time.monotonic() < deadline and proc.poll() is None:
            if state.is_file() and json.loads(state.read_text())["next_position"] >= 15:
                break
            time.sleep(0.05)
        assert proc.poll() is None, "the pack finished before it could be killed"
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # the pack's own worker processes
        except ProcessLookupError:
            pass
    assert not out.exists()

    rerun = stallscope(str(source), str(out), *args)
    assert rerun.returncode == 0, rerun.stderr
    assert "resumed at source #" in rerun.stdout
    assert stallscope("--verify", str(out)).returncode == 0
    assert load_index(out).digest == load_index(clean).digest
    killed, reference = PackedImageDataset(out), PackedImageDataset(clean)
    assert [killed.raw(i) for i in range(len(killed))] == [reference.raw(i) for i in range(len(reference))]
    if fmt == "wds":
        assert all((out / n).read_bytes() == (clean / n).read_bytes() for n in load_index(clean).shards)
    again = stallscope(str(source), str(out), *args)
    assert again.returncode == 0 and "nothing to do" in again.stdout


def test_force_refuses_to_delete_the_folder_holding_the_source(source, tmp_path):
    """``stallscope pack dir/src dir --force`` once deleted ``dir`` before reading an image."""
    folder = tmp_path / "dir"
    shutil.copytree(source, folder / "src")
    (folder / "unrelated.txt").write_text("mine")
    files = sorted(p.relative_to(folder) for p in folder.rglob("*"))
    done = stallscope(str(folder / "src"), str(folder), "--force")
    assert done.returncode == 2 and "contains the source" in done.stderr
    assert "Traceback" not in done.stderr
    assert sorted(p.relative_to(folder) for p in folder.rglob("*")) == files


def bounded_pack(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """``stallscope pack`` with its memory capped and a deadline (``tests/capped.py``)."""
    return capped_python("from stallscope.cli.entry import main; raise SystemExit(main())", "pack", *args,
                         timeout=timeout)


def _skipped(report: Path) -> dict[str, tuple[str, str]]:
    return {p["source"]: (p["kind"], p["detail"]) for p in json.loads(report.read_text())["skipped"]}


@pytest.mark.parametrize("fmt", ["lmdb", "wds"])
def test_a_file_list_naming_a_device_skips_it_by_name(source, tmp_path, fmt):
    """Issue 43, case 3: ``/dev/zero`` in a file list made ``pack --workers 1`` eat 8.4 GB in 7 s, silent."""
    good = sorted((source / "class_00").glob("*.jpg"))[:3]
    listing = tmp_path / "z.csv"
    listing.write_text("path,label\n/dev/zero,0\n" + "".join(f"{p},1\n" for p in good))
    report = tmp_path / "report.json"
    done = bounded_pack(str(listing), str(tmp_path / "out"), "--workers", "1", "--format", fmt, "--report", str(report))
    assert done.returncode == 0, done.stderr[-2000:]
    assert _skipped(report) == {"/dev/zero": ("not-a-file", "not a regular file: character device")}
    assert json.loads(report.read_text())["records"] == 3
    assert "/dev/zero: not a regular file: character device" in done.stdout
    assert "skipped 1 bad file(s)" in done.stdout


def _hostile_entries(folder: Path) -> dict[str, str]:
    """Paths named like images that are not images one can read to an end: each with the start of the reason
    pack must give. Made for real: a FIFO nobody writes to, a listening socket, links to devices."""
    folder.mkdir(parents=True, exist_ok=True)
    os.mkfifo(folder / "pipe.jpg")
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(str(folder / "socket.jpg"))
    (folder / "folder.jpg").mkdir()
    os.symlink("/dev/zero", folder / "zero.jpg")
    os.symlink("/dev/urandom", folder / "random.jpg")
    os.symlink(folder / "nothing-here.jpg", folder / "dangling.jpg")
    os.symlink(folder / "loop.jpg", folder / "loop.jpg")
    os.symlink("/proc/self/status", folder / "proc.jpg")
    return {"pipe.jpg": "not-a-file: not a regular file: FIFO",
            "socket.jpg": "not-a-file: not a regular file: socket",
            "folder.jpg": "not-a-file: not a regular file: directory",
            "zero.jpg": "not-a-file: not a regular file: character device (a link to /dev/zero)",
            "random.jpg": "not-a-file: not a regular file: character device (a link to /dev/urandom)",
            "dangling.jpg": "unreadable: FileNotFoundError",
            "loop.jpg": "unreadable: OSError: Too many levels of symbolic links",
            "proc.jpg": "changed: its size was 0 bytes when opened, and it held more"}


def assert_each_named(done: subprocess.CompletedProcess, report: Path, folder: str, expected: dict[str, str]) -> None:
    """The pack ended well and skipped exactly ``expected`` (name -> reason) of ``folder``, each named in its
    output and in its report."""
    assert done.returncode == 0, done.stderr[-2000:]
    skipped = _skipped(report)
    assert set(skipped) == {f"{folder}/{name}" for name in expected}
    for name, reason in expected.items():
        kind, detail = skipped[f"{folder}/{name}"]
        assert f"{kind}: {detail}".startswith(reason), (name, kind, detail)
        assert f"{folder}/{name}: {detail}" in done.stdout


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
@pytest.mark.parametrize("fmt", ["lmdb", "wds"])
def test_files_that_are_not_regular_are_named_in_a_file_list(source, tmp_path, fmt):
    """Every kind of path a file list can name that is no regular file: skipped, named with its reason, never
    read to its end, never waited on."""
    expected = _hostile_entries(tmp_path / "odd")
    good = sorted((source / "class_00").glob("*.jpg"))[:2]
    listing = tmp_path / "list.txt"
    listing.write_text("".join(f"odd/{name},0\n" for name in expected) + "".join(f"{p},1\n" for p in good))
    report = tmp_path / "report.json"
    done = bounded_pack(str(listing), str(tmp_path / "out"), "--workers", "1", "--format", fmt, "--report", str(report))
    assert_each_named(done, report, "odd", expected)
    assert json.loads(report.read_text())["records"] == 2


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
@pytest.mark.parametrize("workers", ["0", "2"])
def test_files_that_are_not_regular_are_named_in_an_image_folder(source, tmp_path, workers):
    """The ImageFolder scan once dropped a FIFO or a link to a device named *.jpg without a word: the pack now
    names each (a folder named *.jpg is a folder there, as torchvision has it); a link to a folder above
    it (a loop) is not followed round and round."""
    src = tmp_path / "src"
    shutil.copytree(source / "class_00", src / "a")
    expected = _hostile_entries(src / "b")
    del expected["folder.jpg"]
    os.symlink("..", src / "b" / "up")  # a loop: src/b/up/b/up/...
    report = tmp_path / "report.json"
    done = bounded_pack(str(src), str(tmp_path / "out"), "--workers", workers, "--report", str(report))
    assert_each_named(done, report, "b", expected)
    assert json.loads(report.read_text())["records"] == len(list((source / "class_00").glob("*.jpg")))
    strict = bounded_pack(str(src), str(tmp_path / "strict"), "--strict", "--workers", workers)
    assert strict.returncode == 1 and "b/" in strict.stderr and not (tmp_path / "strict").exists()


@pytest.fixture(scope="module")
def lmdb_pack(source, tmp_path_factory):
    out = tmp_path_factory.mktemp("structural") / "pack"
    assert stallscope(str(source), str(out), "--format", "lmdb").returncode == 0
    return out


@pytest.mark.parametrize("damage", ["meta-magic", "meta-last-page", "truncated-early", "truncated-by-one-byte"])
def test_verify_reports_structural_lmdb_damage_in_one_line(lmdb_pack, tmp_path, damage):
    out = tmp_path / "pack"
    shutil.copytree(lmdb_pack, out)
    blob = bytearray((out / "data.mdb").read_bytes())
    if damage == "meta-magic":
        blob[16] ^= 0xFF  # page 0's magic
        blob[4096 + 16] ^= 0xFF  # and page 1's: no valid meta page is left
    elif damage == "meta-last-page":
        for page in (0, 4096):
            blob[page + 136 + 3] ^= 0x10  # both meta pages claim far more pages than the file holds
    elif damage == "truncated-early":
        blob = blob[:10_000]
    else:
        blob = blob[:-1]
    (out / "data.mdb").write_bytes(bytes(blob))
    bad = stallscope("--verify", str(out))
    assert bad.returncode == 1, (bad.returncode, bad.stdout, bad.stderr)  # not 135 (SIGBUS), not a traceback
    assert "Traceback" not in bad.stderr and not bad.stderr.strip(), bad.stderr
    [line] = bad.stdout.strip().splitlines()
    assert line.startswith(f"FAILED: {out} (lmdb") and "data.mdb" in line
    # Reading it as a dataset is a clear error too, not a bus error that kills the training process.
    read = subprocess.run([sys.executable, "-c", "import sys\nfrom stallscope.data import PackedImageDataset\n"
                           "try:\n    PackedImageDataset(sys.argv[1]).raw(0)\nexcept Exception as e:\n"
                           "    print(type(e).__name__, e)\n", str(out)], capture_output=True, text=True, timeout=120)
    assert read.returncode == 0, read.stderr[-2000:]
    assert read.stdout.strip(), "the damaged pack was read without complaint"


def test_a_second_pack_into_the_same_out_is_refused_while_the_first_runs(source, tmp_path):
    out = tmp_path / "out"
    env = {**os.environ, ENV_PACK_THROTTLE: "0.05"}
    first = subprocess.Popen([sys.executable, "-m", "stallscope", "pack", str(source), str(out), "--workers", "1",
                              "--commit-every", "5"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True)
    state = out.with_name("out.partial") / "state.json"
    deadline = time.monotonic() + 120  # a guard against hanging, not a timing assertion
    while time.monotonic() < deadline and first.poll() is None and not state.is_file():
        time.sleep(0.05)
    try:
        assert first.poll() is None, "the first pack finished before the second could start"
        second = stallscope(str(source), str(out), "--workers", "1", "--force")
        assert second.returncode != 0 and "Traceback" not in second.stderr
        assert "another stallscope pack" in second.stderr and f"pid {first.pid}" in second.stderr, second.stderr
        stdout, stderr = first.communicate(timeout=180)
    finally:
        if first.poll() is None:
            first.kill()
    assert first.returncode == 0, stderr
    assert stallscope("--verify", str(out)).returncode == 0
    assert not list(tmp_path.glob(".*lock")), "the lock is removed when the pack ends"


def _default_sigint() -> None:
    """In the child: SIGINT as a terminal user has it, even when pytest was started with it ignored."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.parametrize("fmt", ["lmdb", "wds"])
def test_ctrl_c_mid_pack_with_workers_exits_130_quietly_then_resumes(source, tmp_path, fmt):
    """Ctrl-C reached the pool's workers too: each printed a ``Process ForkPoolWorker`` traceback, and a worker
    killed holding the task queue's lock could hang ``Pool.terminate()``."""
    import psutil

    args = ["--format", fmt, "--workers", "2", "--commit-every", "5", "--shard-size", "5"]
    out = tmp_path / "out"
    env = {**os.environ, ENV_PACK_THROTTLE: "0.1"}
    # A new session, as a terminal's foreground job is its own process group: Ctrl-C goes to the whole group.
    proc = subprocess.Popen([sys.executable, "-m", "stallscope", "pack", str(source), str(out), *args], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                            preexec_fn=_default_sigint)  # noqa: PLW1509 - sets one signal, takes no lock
    state = out.with_name("out.partial") / "state.json"
    deadline = time.monotonic() + 120  # a guard against hanging, not a timing assertion
    try:
        while time.monotonic() < deadline and proc.poll() is None:
            if state.is_file() and json.loads(state.read_text())["next_position"] >= 10:
                break
            time.sleep(0.05)
        assert proc.poll() is None, "the pack finished before it could be interrupted"
        workers = psutil.Process(proc.pid).children(recursive=True)
        assert len(workers) >= 2
        os.killpg(proc.pid, signal.SIGINT)
        _, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 130, stderr
    assert "Traceback" not in stderr and "ForkPoolWorker" not in stderr, stderr
    assert "run the same command again to go on" in stderr, stderr
    assert not any(w.is_running() and w.status() != psutil.STATUS_ZOMBIE for w in workers), "a worker outlived it"
    assert not out.exists()

    rerun = stallscope(str(source), str(out), *args)
    assert rerun.returncode == 0, rerun.stderr
    assert "resumed at source #" in rerun.stdout
    verify = stallscope("--verify", str(out))
    assert verify.returncode == 0 and "ok: 60 records" in verify.stdout


@pytest.mark.parametrize("fmt", ["lmdb", "wds"])
def test_a_full_disk_mid_pack_is_one_clear_line_and_the_same_command_resumes(source, tmp_path, fmt):
    """A 256 KiB tmpfs fills part-way through 60 images: one line saying so (not "a bug in stallscope"), the
    unfinished pack kept; with room again the same command finishes it and it verifies."""
    from tests.conftest import on_a_small_disk

    disk = tmp_path / "disk"
    out = disk / "pack"
    command = f"{sys.executable} -m stallscope pack {source} {out} --format {fmt} --no-progress --commit-every 8"
    done = on_a_small_disk(tmp_path, disk, size="256k", timeout=240, commands=(
        f"{command} 2> {tmp_path / 'full.err'}; echo $? > {tmp_path / 'full.rc'}; ls {disk} > {tmp_path / 'kept'}; "
        f"mount -o remount,size=8m {disk} && {command} && {sys.executable} -m stallscope pack --verify {out}"))
    full = (tmp_path / "full.err").read_text()
    assert (tmp_path / "full.rc").read_text().strip() == "1", full
    assert "internal error" not in full and "Traceback" not in full, full
    assert f"packing into {out}.partial failed" in full and "run the same command again" in full, full
    assert "pack.partial" in (tmp_path / "kept").read_text()  # what was packed so far, kept to resume from
    assert done.returncode == 0, done.stdout + done.stderr
    assert "ok: 60 records" in done.stdout


def test_an_out_folder_that_cannot_be_written_is_one_clear_line(source, tmp_path):
    from tests.conftest import can_mount_tmpfs

    ro = tmp_path / "ro"
    ro.mkdir()
    if not can_mount_tmpfs(ro):
        pytest.skip("this machine does not allow private mounts")
    command = f"{sys.executable} -m stallscope pack {source} {ro / 'pack'} --no-progress"
    done = subprocess.run(["unshare", "-rm", "sh", "-c", f"mount --bind -o ro {ro} {ro} && {command}"],
                          capture_output=True, text=True, timeout=240, cwd=tmp_path)
    assert done.returncode == 1, done.stderr
    assert "internal error" not in done.stderr and "Traceback" not in done.stderr, done.stderr
    assert f"packing into {ro / 'pack'} failed: Read-only file system" in done.stderr
    assert "nothing was written" in done.stderr


def test_a_report_the_full_disk_refused_exits_1_with_one_line(source, tmp_path):
    """The pack is made but the --report file asked for is not: whatever reads it next would not find it, so the
    command does not succeed (exit 1), and says so in one line with the pack's place."""
    from tests.conftest import on_a_small_disk

    full = tmp_path / "full"
    out = tmp_path / "out"
    command = f"{sys.executable} -m stallscope pack {source} {out} --no-progress --report {full / 'report.json'}"
    done = on_a_small_disk(tmp_path, full, command, fill=True, timeout=240)
    assert done.returncode == 1, done.stderr
    assert done.stderr.strip().splitlines() == [
        (f"stallscope pack: error: the report was not written to {full / 'report.json'}: No space left on device "
         f"(the pack itself is complete in {out})")]
    assert stallscope("--verify", str(out)).returncode == 0


def test_a_report_that_cannot_be_written_is_refused_before_packing(source, tmp_path):
    out, folder = tmp_path / "out", tmp_path / "a-folder"
    folder.mkdir()
    done = stallscope(str(source), str(out), "--no-progress", "--report", str(folder))
    assert done.returncode == 2 and not out.exists() and not Path(f"{out}.partial").exists(), done.stderr
    [line] = done.stderr.strip().splitlines()
    assert line.startswith(f"stallscope pack: cannot write {folder}: ")
    verify = stallscope("--verify", str(out), "--report", str(tmp_path / "r.json"))
    assert verify.returncode == 2 and "--report describes a pack being made" in verify.stderr
