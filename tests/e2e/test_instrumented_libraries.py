"""Decoders and transforms of torchvision.io, transforms v2 and OpenCV are timed by call, in workers."""

from __future__ import annotations

import sys

import pytest

from tests.conftest import SCRIPTS, run_cli

pytestmark = pytest.mark.e2e


@pytest.mark.parametrize("workers", ["0", "2"])
def test_torchvision_io_and_transforms_v2(tmp_path, image_folder, workers):
    result = run_cli(tmp_path, ["--", sys.executable, str(SCRIPTS / "libraries_train.py"), str(image_folder), "v2",
                                workers])
    assert result.returncode == 0, result.stderr[-3000:]
    pipeline = result.summary["loaders"][0]["pipeline"]
    calls = pipeline["by_call_s"]
    assert "torchvision.io.decode_jpeg" in calls and "torchvision.io.read_file" in calls
    assert {"RandomResizedCrop", "Normalize", "ToDtype"} <= set(calls)
    assert pipeline["node_seconds"]["decode"] > 0 and pipeline["node_seconds"]["transform"] > 0


def test_opencv(tmp_path, image_folder):
    pytest.importorskip("cv2")
    result = run_cli(tmp_path, ["--", sys.executable, str(SCRIPTS / "libraries_train.py"), str(image_folder),
                                "cv2", "1"])
    assert result.returncode == 0, result.stderr[-3000:]
    calls = result.summary["loaders"][0]["pipeline"]["by_call_s"]
    assert {"cv2.imread", "cv2.cvtColor", "cv2.resize"} <= set(calls)


def test_stallscopes_own_turbojpeg_backend_is_decode(tmp_path, image_folder):
    from stallscope.data.decoders import available_decoders

    if "turbojpeg" not in available_decoders():
        pytest.skip("the turbo extra is not installed")
    result = run_cli(tmp_path, ["--", sys.executable, str(SCRIPTS / "libraries_train.py"), str(image_folder),
                                "turbojpeg", "1"])
    assert result.returncode == 0, result.stderr[-3000:]
    pipeline = result.summary["loaders"][0]["pipeline"]
    assert "turbojpeg.decode_jpeg" in pipeline["by_call_s"]
    assert pipeline["node_seconds"]["decode"] > 0

