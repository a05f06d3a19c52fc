# Sourced by bench/gpu/run.sh and python.sh with `pack` set to bench/gpu/pack.sh's folder: finds
# the GPU machine's own NCCL, cuBLAS, CUPTI and CUDA runtime (PyTorch's, or the toolkit's; by
# name, so that a process that also loads torch shares its copies), sets nccl, cublas, cublaslt,
# cupti and cudart to their paths ("" when absent) and exports LD_LIBRARY_PATH: the pack's own
# libraries first, then those libraries' folders, the toolkit's, and the pack's fallbacks (Open
# MPI, the CUDA runtime) for what the machine lacks.
lib_of() { find / -xdev -name "$1" 2>/dev/null | head -1; }
nccl=$(lib_of libnccl.so.2) cublas=$(lib_of libcublas.so.13) cublaslt=$(lib_of libcublasLt.so.13)
cupti=$(lib_of libcupti.so.13) cudart=$(lib_of libcudart.so.13)
LD_LIBRARY_PATH="$pack/lib:$(for lib in "$nccl" "$cublas" "$cupti" "$cudart"; do
  if [ -n "$lib" ]; then dirname "$lib"; fi; done | awk '!seen[$0]++' | tr '\n' ':')/usr/local/cuda/lib64:$pack/lib-fallback"
export LD_LIBRARY_PATH
