#!/usr/bin/env bash
# Run here, before the device call: fetches the wheels the GPU machine lacks into .whl/ (ignored by git), for its
# Python (3.12 on the lent H200 machines; PYTHON_VERSION=3.x for another). That machine already has torch,
# torchvision, psutil, rich, pytest, nvidia-ml-py, OpenCV, Pillow and scikit-image (the demo dataset's photos), but
# not the fast path's decoders: simplejpeg, and the turbojpeg wheel that bundles the TurboJPEG 3 library.
# Then: run(command="bash benchmarks/gpu_check.sh", carry=[".whl"], timeout_s=590).
set -eu
cd "$(dirname "$0")/.."
PY=${PYTHON_VERSION:-3.12}
rm -rf .whl && mkdir .whl
python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$PY" --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  -d .whl simplejpeg 'turbojpeg==0.0.2'
ls -l .whl
du -sh .whl
