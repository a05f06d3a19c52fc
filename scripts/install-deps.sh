#!/usr/bin/env bash
# Installs the Debian packages Cupcake builds and tests with, when they are missing.
# Usage: scripts/install-deps.sh   (as root, or with sudo available)
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config
  libprotobuf-dev protobuf-compiler
  libboost-program-options-dev
  libsqlite3-dev sqlite3
  libblas-dev  # CBLAS (cblas.h, libblas.so) for PowerSGD's host matrix products
  libopenmpi-dev openmpi-bin
  libgloo-dev  # the gloo communicator (host memory without MPI: torchrun jobs)
  libgtest-dev libgmock-dev libbenchmark-dev
  nlohmann-json3-dev
  clang-14 libclang-rt-14-dev
  librsvg2-bin
  # LibTorch builds examples/train_mlp: scripts/demo.sh records its backward times on this
  # machine and the test train_mlp_np2 trains it. With its dependencies it is most of the
  # download (about 200 packages); without it the build leaves the example and its test out.
  libtorch-dev
  # The Python package (python/, docs/PYTHON.md): built with python3-dev and pybind11-dev; its
  # tests and examples/python train with python3-torch (Debian's PyTorch 1.13, on the same
  # libtorch as libtorch-dev). Without them the package or its tests are left out or skipped.
  python3-dev pybind11-dev python3-torch
  # The time-to-accuracy harness (bench/python/tta.sh) trains on the handwritten digits that
  # python3-sklearn ships (sklearn/datasets/data/digits.csv.gz, read by bench/python/digits.py,
  # not by sklearn); the loader's test checks that file when it is there.
  python3-sklearn
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#packages[@]} packages present"
  exit 0
fi

sudo=""
if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
echo "install-deps: installing ${missing[*]}"
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
