#!/usr/bin/env bash
# Packs the GPU tests and benchmarks of a build (scripts/build.sh with CUDA) for a GPU machine
# that has a CUDA driver, NCCL and CUPTI but not this machine's Debian libraries: the binaries,
# the shared libraries they need from here (protobuf, sqlite; Open MPI's and the CUDA runtime's
# as fallbacks), and what bench/gpu/python.sh needs to build the Python module there against that
# machine's own Python (the libraries it links, the generated protobuf headers, protobuf's
# headers), Open MPI (bench/gpu/mpi-pack.sh, into OUT/mpi), iproute2's ip and tc
# (bench/gpu/netprobe-pack.sh, into OUT/netprobe), and OUT/build: the tools and train_replay where
# bench/testbed/evaluate.sh looks for them in a build folder. Run bench/gpu/all.sh (or run.sh,
# python.sh, mpi.sh) there from the repository root.
# Usage: bench/gpu/pack.sh [OUT]   (default .gpu-pack; CUPCAKE_BUILD_DIR picks the build)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
build="${CUPCAKE_BUILD_DIR:-$root/build}"
out="${1:-$root/.gpu-pack}"
bins=(test/kernels/kernels_compressor_test test/kernels/kernels_cuda_test test/kernels/kernels_zen_cuda_test
      test/kernels/kernels_powersgd_test
      test/comm/comm_zen_device_test test/runtime/runtime_gpu_test
      test/profile/profile_gpu_test test/profile/profile_nccl_test test/comm/comm_nccl_test
      test/runtime/runtime_session_test test/runtime/runtime_recorder_test test/tools/tools_profile_kernels_test
      bench/runtime/runtime_gpu_bench
      bench/kernels/gpu_kernels_bench
      tools/cupcake-profile tools/cupcake-plan examples/train_replay/train_replay)
rm -rf "$out"
mkdir -p "$out/bin" "$out/lib" "$out/lib-fallback"
for b in "${bins[@]}"; do
  [ -x "$build/$b" ] || { echo "pack.sh: $build/$b: not built (a CUDA build is needed)" >&2; exit 2; }
  cp "$build/$b" "$out/bin/"
done
# Every non-system library the binaries link, by where it comes from here.
ldd "$out"/bin/* | awk '$3 ~ /^\// {print $3}' | sort -u | while read -r lib; do
  case "$(basename "$lib")" in
    libc.so*|libm.so*|libdl.so*|libpthread.so*|librt.so*|libutil.so*|libgcc_s.so*|libstdc++.so*|libz.so*) ;;
    libnccl.so*|libcublas*) ;;  # large; the GPU machine's own (its PyTorch's)
    libprotobuf*|libsqlite3*|libboost*) cp -L "$lib" "$out/lib/" ;;
    *) cp -L "$lib" "$out/lib-fallback/" ;;
  esac
done
# The Python module's parts: libruntime and what it links, in link order.
mkdir -p "$out/py/lib" "$out/py/include"
for a in libruntime/libcupcake_runtime.a libcomm/libcupcake_comm.a kernels/libcupcake_kernels.a proto/libcupcake_proto.a; do
  [ -f "$build/$a" ] || { echo "pack.sh: $build/$a: not built" >&2; exit 2; }
  cp "$build/$a" "$out/py/lib/"
done
cp /usr/local/cuda/lib64/libculibos.a "$out/py/lib/"
cp -r "$build/proto/gen" "$out/py/gen"
cp -r /usr/include/google "$out/py/include/"
# What the MPI steps (bench/gpu/mpi.sh) need beyond the binaries.
here="$(dirname "${BASH_SOURCE[0]}")"
"$here/mpi-pack.sh" "$out/mpi" >/dev/null
"$here/netprobe-pack.sh" "$out/netprobe" >/dev/null
mkdir -p "$out/build/tools" "$out/build/examples/train_replay"
ln -s ../../bin/cupcake-profile ../../bin/cupcake-plan "$out/build/tools/"
ln -s ../../../bin/train_replay "$out/build/examples/train_replay/"
echo "pack.sh: $(du -sh "$out" | cut -f1) in $out"
