#!/usr/bin/env bash
# On a GPU machine, from the repository root: builds the `cupcake` Python module against that
# machine's own Python (its CUDA PyTorch and pybind11) from the parts bench/gpu/pack.sh packed,
# then runs test/python/device_test.sh on cuda under that machine's torchrun: a fresh profile of
# the GPU, record mode with CUDA parameters (CUPTI kernel time), plans for --device gpu, and
# DistributedOptimizer's NCCL sessions on GPU memory (fp32 bit for bit, efsignsgd, topk and
# PowerSGD training, the two-device error). Logs into OUT_DIR.
# Usage: bench/gpu/python.sh [PACK] [OUT_DIR]
#   PYTHON: the interpreter (default python3); DEVICE (default cuda) and LAUNCHER (default that
#   interpreter's torch.distributed.run, one worker) let a machine without a GPU rehearse it.
set -euo pipefail
pack="$(cd "${1:-.gpu-pack}" && pwd)"
out="$(mkdir -p "${2:-gpu-results}" && cd "${2:-gpu-results}" && pwd)"
python="${PYTHON:-python3}"
root="$(pwd)"
# The machine's NCCL, cuBLAS, CUPTI and CUDA runtime, which the module links: torch's copies.
source "$(dirname "${BASH_SOURCE[0]}")/libs.sh"
for lib in "$nccl" "$cublas" "$cublaslt" "$cupti" "$cudart"; do
  [ -n "$lib" ] || { echo "python.sh: missing one of libnccl.so.2, libcublas(Lt).so.13, libcupti.so.13, libcudart.so.13" >&2; exit 2; }
done
{ "$python" --version; "$python" -c "import torch; print('torch', torch.__version__, torch.version.cuda, torch.cuda.get_device_name(0))" || true
  c++ --version | head -1; echo "nccl $nccl"; echo "cublas $cublas"; echo "cupti $cupti"; echo "cudart $cudart"
  echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"; } > "$out/python-env.txt" 2>&1

# The module: python/CMakeLists.txt's compile and link, by hand (the machine has no Debian
# protobuf, MPI or gloo; the pack has them).
mod="$out/build/cupcake"
mkdir -p "$mod"
cp python/cupcake/*.py "$mod/"
suffix=$("$python" -c "import sysconfig; print(sysconfig.get_config_var('EXT_SUFFIX'))")
start=$(date +%s)
# pybind11's headers: pip's package, else the system's (Debian's pybind11-dev) beside Python's.
includes=$("$python" -m pybind11 --includes 2>/dev/null ||
           "$python" -c "import sysconfig; print('-I' + sysconfig.get_paths()['include'])")
c++ -O3 -DNDEBUG -fPIC -fvisibility=hidden -std=c++20 $includes \
  -Ilibruntime/include -Iproto/include -Ilibcomm/include -Ikernels/include -I"$pack/py/gen" -isystem "$pack/py/include" \
  -c python/src/module.cc -o "$out/build/module.o"
c++ -shared -o "$mod/_runtime$suffix" "$out/build/module.o" \
  "$pack"/py/lib/libcupcake_runtime.a "$pack"/py/lib/libcupcake_comm.a "$pack"/py/lib/libcupcake_kernels.a \
  "$pack"/py/lib/libcupcake_proto.a "$pack"/py/lib/libculibos.a \
  "$pack"/lib-fallback/libmpi.so.40 "$pack"/lib-fallback/libgloo.so.0 "$pack"/lib-fallback/libblas.so.3 \
  "$pack"/lib/libprotobuf.so.32 "$nccl" "$cublas" "$cublaslt" "$cupti" "$cudart" -lrt -lpthread -ldl
echo "python.sh: built $mod/_runtime$suffix in $(( $(date +%s) - start )) s"
export PYTHONPATH="$out/build:$root/test/python"
"$python" -c "import cupcake.torch; print('python.sh: imported', cupcake.__file__)"

read -r -a launcher <<<"${LAUNCHER:-$python -m torch.distributed.run --standalone --nproc_per_node 1 --no-python}"
test/python/device_test.sh "${DEVICE:-cuda}" "$out/device" "$python" "$pack/bin/cupcake-profile" \
  "$pack/bin/cupcake-plan" "${launcher[@]}"
