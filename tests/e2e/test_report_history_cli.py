"""History, compare and the HTML / Perfetto reports through the real CLI on the tiny training script."""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import SCRIPTS
from tests.unit.test_render_trace import check_trace_format

pytestmark = pytest.mark.e2e
TINY = str(SCRIPTS / "tiny_train.py")
#: Input-bound by construction: 8 samples x 5 ms of sleep per batch, almost no compute.
INPUT_BOUND = ["--", sys.executable, TINY, "--sleep-ms", "5", "--workers", "0", "--n", "240"]


def cli(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "stallscope", *args], capture_output=True, text=True,
                          timeout=120, cwd=tmp_path)


def table_line(markdown: str, label: str) -> list[str]:
    line = next(line for line in markdown.splitlines() if line.startswith(f"| {label}"))
    return [cell.strip() for cell in line.strip("|").split(" | ")]


def record(tmp: Path, store: Path, json_name: str, *args: str) -> subprocess.Popen:
    """Start ``stallscope run`` (one torch thread, so runs on a small shared machine disturb each other less)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.Popen([sys.executable, "-m", "stallscope", "run", "--quiet", "--store", str(store),
                             "--json", str(tmp / json_name), *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, cwd=tmp, env=env)


def finish(proc: subprocess.Popen, tmp: Path, json_name: str) -> str:
    _, err = proc.communicate(timeout=240)
    assert proc.returncode == 0, err[-3000:]
    return json.loads((tmp / json_name).read_text())["run_id"]


def record_three(tmp: Path) -> dict:
    """Two runs of one configuration at the same time (so that both see the same load on a shared
    machine: mostly asleep, they hardly slow each other), then the same with 2 workers."""
    store = tmp / "store"
    started = [record(tmp, store, f"same{i}.json", *INPUT_BOUND) for i in range(2)]
    same = [finish(proc, tmp, f"same{i}.json") for i, proc in enumerate(started)]
    workers = finish(record(tmp, store, "workers.json", "--set", "num_workers=2", *INPUT_BOUND), tmp, "workers.json")
    return {"tmp": tmp, "store": store, "same": same, "workers": workers}


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
    """The three runs, shared by the tests that read them but do not judge their speed."""
    return record_three(tmp_path_factory.mktemp("history"))


def test_two_runs_recording_into_one_store_at_once_are_both_intact(tmp_path):
    store = tmp_path / "store"
    procs = [record(tmp_path, store, f"c{i}.json", "--", sys.executable, TINY, "--workers", "2") for i in range(2)]
    ids = [finish(proc, tmp_path, f"c{i}.json") for i, proc in enumerate(procs)]
    rows = json.loads(cli(tmp_path, "history", "--store", str(store), "--json").stdout)
    assert sorted(r["run_id"] for r in rows) == sorted(ids) and len(set(ids)) == 2
    for row in rows:
        # 12 steps; the warm-up runs to the two workers' first batches
        assert row["steady_steps"] == 10 and row["step_median_s"] > 0 and row["exit_code"] == 0
        assert Path(row["session_path"]).is_file()
    conn = sqlite3.connect(store / "history.sqlite3")
    assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    conn.close()


def test_history_has_the_runs_with_their_overrides(runs):
    rows = json.loads(cli(runs["tmp"], "history", "--store", str(runs["store"]), "--json").stdout)
    ids = [r["run_id"] for r in rows]
    assert sorted(ids[:2]) == sorted(runs["same"]) and ids[2:] == [runs["workers"]]
    assert [r["overrides"] for r in rows] == [{}, {}, {"num_workers": 2}]
    assert [r["steady_steps"] for r in rows] == [29, 29, 28]  # 2 workers: warm-up to their first batches


def test_history_table_and_filters(runs):
    table = cli(runs["tmp"], "history", "--store", str(runs["store"]))
    assert table.returncode == 0, table.stderr
    assert all(run_id in table.stdout for run_id in runs["same"])
    filtered = cli(runs["tmp"], "history", "--store", str(runs["store"]), "--verdict", "compute-bound")
    assert filtered.returncode == 2 and "no run matches" in filtered.stderr
    empty = cli(runs["tmp"], "history", "--store", str(runs["tmp"] / "nothing-here"))
    assert empty.returncode == 2 and "no run history" in empty.stderr


@pytest.mark.speed  # the runs' rates on this machine: a rerun records them again (its own runs, not the module's)
def test_compare_says_the_same_configuration_is_within_noise_and_two_workers_beyond_it(tmp_path):
    runs = record_three(tmp_path)
    result = cli(runs["tmp"], "compare", *runs["same"], "--store", str(runs["store"]),
                 "--output", str(runs["tmp"] / "same.md"))
    assert result.returncode == 0, result.stderr
    print(result.stdout)
    assert "beyond noise**" not in result.stdout
    for label in ("step time median", "throughput (steps/s)", "data-wait share"):
        assert "within noise" in table_line(result.stdout, label)[3]
    assert (runs["tmp"] / "same.md").read_text() == result.stdout

    result = cli(runs["tmp"], "compare", runs["same"][0], runs["workers"], "--store", str(runs["store"]))
    assert result.returncode == 0, result.stderr
    print(result.stdout)
    throughput = table_line(result.stdout, "throughput (steps/s)")
    assert "**beyond noise** (better)" in throughput[3]
    assert float(throughput[2]) > 1.3 * float(throughput[1])


def test_compare_errors(runs):
    unknown = cli(runs["tmp"], "compare", runs["same"][0], "nope", "--store", str(runs["store"]))
    assert unknown.returncode == 2 and "no run 'nope'" in unknown.stderr
    single = cli(runs["tmp"], "compare", runs["same"][0], "--store", str(runs["store"]))
    assert single.returncode == 2


def test_report_writes_html_and_a_trace_with_one_track_per_worker(runs):
    out = runs["tmp"] / "out"
    out.mkdir(exist_ok=True)
    result = cli(runs["tmp"], "report", runs["workers"], "--store", str(runs["store"]),
                 "--html", str(out / "r.html"), "--trace", str(out / "t.json"))
    assert result.returncode == 0, result.stderr
    assert "<script>" in (out / "r.html").read_text()[:200_000]
    doc = json.loads((out / "t.json").read_text())
    check_trace_format(doc)
    threads = {e["args"]["name"] for e in doc["traceEvents"] if e["ph"] == "M" and e["name"] == "thread_name"
               and e["pid"] >= 10}
    # one track of batches per worker; beside it, where stacks were sampled, one of its sampled stacks
    assert {t for t in threads if "sampled stacks" not in t} == {"worker 0", "worker 1"}
    assert all(t.startswith(("worker 0 (pid", "worker 1 (pid")) for t in threads if "sampled stacks" in t)
    session = json.loads(Path(runs["store"] / "runs" / runs["workers"] / "session.json").read_text())
    span_us = (session["end_ns"] - session["start_ns"]) / 1000
    batches = [e for e in doc["traceEvents"] if e.get("cat") == "batch"]
    assert len(batches) == 30 and all(0 <= b["ts"] and b["ts"] + b["dur"] <= span_us for b in batches)


def test_report_unwritable_output_is_a_clear_error(runs):
    (runs["tmp"] / "a-file").write_text("")
    result = cli(runs["tmp"], "report", runs["workers"], "--store", str(runs["store"]),
                 "--html", str(runs["tmp"] / "a-file" / "r.html"))
    assert result.returncode == 2 and "cannot write" in result.stderr and "a-file is a file, not a folder" in result.stderr


def test_report_never_writes_over_the_store(runs):
    """A report written over the session it is made from would lose the measurements for good."""
    run_dir = runs["store"] / "runs" / runs["same"][0]
    session = run_dir / "session.json"
    before = session.read_bytes()
    for option, target in (("--json", session), ("--html", runs["store"] / "history.sqlite3"),
                           ("--trace", run_dir / "trace.json")):
        result = cli(runs["tmp"], "report", runs["same"][0], "--store", str(runs["store"]), option, str(target))
        assert result.returncode == 2 and "inside the store" in result.stderr, result.stderr
    assert session.read_bytes() == before and not (run_dir / "trace.json").exists()
    plan = cli(runs["tmp"], "plan", runs["same"][0], "--store", str(runs["store"]), "--json", str(session))
    assert plan.returncode == 2 and "inside the store" in plan.stderr and session.read_bytes() == before
    compared = cli(runs["tmp"], "compare", "last~1", "last", "--store", str(runs["store"]), "--output", str(session))
    assert compared.returncode == 2 and "inside the store" in compared.stderr and session.read_bytes() == before
    # a verb without --store (doctor) still knows a run folder when it sees one
    doctor = cli(runs["tmp"], "doctor", "--no-bench", "--json", str(session))
    assert doctor.returncode == 2 and "a file of the stallscope run" in doctor.stderr and session.read_bytes() == before


def test_report_writes_through_a_link_and_survives_any_terminal(runs):
    real = runs["tmp"] / "kept" / "summary.json"
    real.parent.mkdir(exist_ok=True)
    real.write_text("{}")
    link = runs["tmp"] / "link.json"
    link.unlink(missing_ok=True)
    link.symlink_to(real)
    args = ["report", runs["workers"], "--store", str(runs["store"])]
    linked = cli(runs["tmp"], *args, "--json", str(link))
    assert linked.returncode == 0 and link.is_symlink() and json.loads(real.read_text())["run_id"] == runs["workers"]
    for env in ({"PYTHONIOENCODING": "ascii"}, {"COLUMNS": "0"}):  # once a traceback, and nothing at all
        done = subprocess.run([sys.executable, "-m", "stallscope", *args], capture_output=True, text=True,
                              timeout=120, cwd=runs["tmp"], env={**os.environ, **env})
        assert done.returncode == 0 and "Traceback" not in done.stderr, (env, done.stderr[-2000:])
        assert "limiting stage" in done.stdout, env


@pytest.mark.parametrize("content", [b"[1]", b'{"schema": "stallscope.session/1"}', b"[" * 100_000, b"\xff\xfe\x00",
                                     b'{"schema": "stallscope.session/1", "run_id": 3}'])
def test_report_of_a_malformed_session_is_one_line_and_exit_2(tmp_path, content):
    bad = tmp_path / "session.json"
    bad.write_bytes(content)
    for verb in (["report", str(bad)], ["compare", str(bad), str(bad)], ["merge", str(bad), str(bad), "-o",
                                                                        str(tmp_path / "m.json")]):
        done = subprocess.run([sys.executable, "-m", "stallscope", *verb, "--store", str(tmp_path / "store")],
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 2 and "Traceback" not in done.stderr, (verb, done.stderr[-2000:])
        assert str(bad) in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr


def test_report_takes_last_n_like_compare(runs):
    ids = []
    for ref in ("last~1", "last~2"):
        out = runs["tmp"] / f"{ref}.json"
        done = cli(runs["tmp"], "report", ref, "--store", str(runs["store"]), "--json", str(out))
        assert done.returncode == 0, done.stderr
        ids.append(json.loads(out.read_text())["run_id"])
    assert sorted(ids) == sorted(runs["same"])
    beyond = cli(runs["tmp"], "report", "last~3", "--store", str(runs["store"]))
    assert beyond.returncode == 2 and "holds 3" in beyond.stderr and "Traceback" not in beyond.stderr


def test_json_to_standard_output_is_json_alone(runs):
    """--json - is standard output for report and doctor as for plan (it used to make a file named '-')."""
    for args in (["report", runs["workers"], "--store", str(runs["store"])], ["doctor", "--no-bench"]):
        done = cli(runs["tmp"], *args, "--json", "-")
        assert done.returncode in (0, 1) and "Traceback" not in done.stderr, done.stderr[-2000:]
        assert isinstance(json.loads(done.stdout), dict)
    assert not (runs["tmp"] / "-").exists()
    trace = cli(runs["tmp"], "report", runs["workers"], "--store", str(runs["store"]), "--trace", "-")
    assert trace.returncode == 2 and "is not taken here" in trace.stderr


def test_merge_and_compare_rebuild_a_run_folder_whose_session_was_never_saved(tmp_path):
    """As report and plan do: the raw events a run left (a killed launcher, a full disk) are the run."""
    store = tmp_path / "store"
    run_id = finish(record(tmp_path, store, "s.json", "--", sys.executable, TINY, "--n", "64"), tmp_path, "s.json")
    unsaved = tmp_path / "copied" / run_id
    shutil.copytree(store / "runs" / run_id, unsaved)
    (unsaved / "session.json").unlink()
    compared = cli(tmp_path, "compare", run_id, str(unsaved), "--store", str(store))
    assert compared.returncode == 0 and "Traceback" not in compared.stderr, compared.stderr
    assert f"stallscope compare: {unsaved} had no saved session; rebuilt it" in compared.stderr
    (unsaved / "session.json").unlink()
    merged = cli(tmp_path, "merge", str(unsaved), "-o", str(tmp_path / "merged.json"), "--store", str(store))
    # rebuilt, then refused for what it is (one process, no ranks to merge), not "is a directory"
    assert merged.returncode == 2 and f"stallscope merge: {unsaved} had no saved session" in merged.stderr
    assert merged.stderr.strip().splitlines()[-1].endswith("has no ranks: record it with `stallscope run -- "
                                                            "torchrun ...`"), merged.stderr
