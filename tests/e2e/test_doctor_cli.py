"""`python -m stallscope doctor DIR --json out.json` on a small generated JPEG folder, asserted on the JSON."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def jpeg_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("PIL")
    pytest.importorskip("skimage")
    from stallscope.demo.dataset import DatasetSpec, make_dataset

    return make_dataset(tmp_path_factory.mktemp("doctor") / "jpegs", DatasetSpec(n_files=60, width=200, height=160))


def doctor(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "stallscope", "doctor", *args], capture_output=True, text=True,
                          timeout=120, cwd=cwd)


def test_doctor_writes_the_json_contract(jpeg_folder: Path, tmp_path: Path) -> None:
    out = tmp_path / "out.json"
    proc = doctor(str(jpeg_folder), "--json", str(out), cwd=tmp_path)
    assert proc.returncode in (0, 1), proc.stderr
    assert "stallscope doctor" in proc.stdout and "dataset.files" in proc.stdout
    report = json.loads(out.read_text())
    assert report["schema"] == "stallscope.health/1"
    checks = {c["id"]: c for c in report["checks"]}
    for check in report["checks"]:
        assert check["status"] in ("pass", "warn", "fail", "n/a", "unknown")
        assert set(check) >= {"id", "title", "status", "value", "threshold", "why", "fix", "data"}
    assert proc.returncode == (1 if any(c["status"] == "fail" for c in report["checks"]) else 0)
    assert {"cpu.usable", "memory", "shm", "nofile", "threads", "decode.pillow_jpeg", "versions"} <= set(checks)
    files = checks["dataset.files"]["data"]
    assert files["files"] == 61  # 60 JPEGs and the generator's manifest
    formats = checks["dataset.formats"]["data"]["formats"]
    assert formats["jpeg"] == 60 and set(formats) <= {"jpeg", "text"}
    sizes = checks["dataset.image_sizes"]["data"]
    assert 160 <= sizes["p50"][0] <= 240 and 128 <= sizes["p50"][1] <= 192  # the spec's size, +-20%
    bench = checks["storage.bench"]["data"]
    assert 0 < bench["bytes_read"] <= bench["cap_bytes"]
    assert bench["cap_bytes"] == int(files["total_bytes"] * 0.05)
    # the CPU probe ran on a hardware thread of each usable core: 3 rounds of 0.5 s, a figure of cores' work
    from stallscope.health import Host
    from stallscope.health.cpu_probe import cpus_to_probe

    capacity = checks["cpu.capacity"]
    probed, _ = cpus_to_probe(Host())
    if len(probed) < 2:
        assert capacity["status"] == "n/a" and "nothing to compare" in capacity["value"]
    else:
        data = capacity["data"]
        assert data["probed_cpus"] == len(probed) and data["rounds"] == 3 and data["seconds"] == 0.5
        assert 0 < data["effective_cpus"] and data["share"] == pytest.approx(data["effective_cpus"] / len(probed),
                                                                            abs=1e-3)
        assert capacity["status"] == ("pass" if data["share"] >= 0.85 else "warn")


def test_doctor_without_bench(jpeg_folder: Path, tmp_path: Path) -> None:
    out = tmp_path / "out.json"
    proc = doctor(str(jpeg_folder), "--no-bench", "--json", str(out), cwd=tmp_path)
    assert proc.returncode in (0, 1), proc.stderr
    checks = {c["id"]: c for c in json.loads(out.read_text())["checks"]}
    assert checks["storage.bench"]["status"] == "n/a"
    assert checks["cpu.capacity"]["status"] == "n/a" and "--no-bench" in checks["cpu.capacity"]["value"]


@pytest.mark.parametrize("make_bad, message", [
    (lambda tmp: tmp / "missing", "does not exist"),
    (lambda tmp: (tmp / "file.txt").write_text("x") and tmp / "file.txt", "is a file"),
])
def test_bad_input_exits_2(tmp_path: Path, make_bad, message: str) -> None:
    proc = doctor(str(make_bad(tmp_path)), cwd=tmp_path)
    assert proc.returncode == 2
    assert message in proc.stderr and "Traceback" not in proc.stderr
