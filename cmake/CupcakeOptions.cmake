# Resolves CUPCAKE_WITH_{CUDA,NCCL,CUPTI,MPI,GLOO} (ON, OFF or AUTO) into CUPCAKE_HAVE_* booleans.
# ON that cannot be satisfied is a configuration error that names the fix.

function(cupcake_resolve option found fix)
  string(TOUPPER "${${option}}" value)
  string(REPLACE "CUPCAKE_WITH_" "CUPCAKE_HAVE_" have "${option}")
  if(value STREQUAL "OFF" OR value STREQUAL "FALSE" OR value STREQUAL "0")
    set(${have} OFF PARENT_SCOPE)
  elseif(${found})
    set(${have} ON PARENT_SCOPE)
  elseif(value STREQUAL "AUTO")
    set(${have} OFF PARENT_SCOPE)
  else()
    message(FATAL_ERROR "${option}=ON but it cannot be satisfied: ${fix}")
  endif()
endfunction()

# CUDA: the toolkit lives under /usr/local/cuda on our machines; nvcc is often not on PATH.
set(_cuda_found OFF)
string(TOUPPER "${CUPCAKE_WITH_CUDA}" _want_cuda)
if(NOT _want_cuda STREQUAL "OFF")
  if(NOT DEFINED CMAKE_CUDA_COMPILER AND NOT DEFINED ENV{CUDACXX} AND EXISTS /usr/local/cuda/bin/nvcc)
    set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc CACHE FILEPATH "CUDA compiler")
  endif()
  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
      # Bounds the build time: A100 (sm_80) and H100 (sm_90).
      set(CMAKE_CUDA_ARCHITECTURES "80;90" CACHE STRING "CUDA architectures")
    endif()
    enable_language(CUDA)
    find_package(CUDAToolkit)
    if(CUDAToolkit_FOUND)
      set(_cuda_found ON)
    endif()
  endif()
endif()
cupcake_resolve(CUPCAKE_WITH_CUDA _cuda_found
  "install the CUDA toolkit or pass -DCMAKE_CUDA_COMPILER=/path/to/nvcc, or -DCUPCAKE_WITH_CUDA=OFF")

set(_nccl_found OFF)
if(CUPCAKE_HAVE_CUDA)
  find_path(NCCL_INCLUDE_DIR nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS} /usr/local/cuda/include)
  find_library(NCCL_LIBRARY nccl HINTS ${CUDAToolkit_LIBRARY_DIR} /usr/local/cuda/lib64)
  if(NCCL_INCLUDE_DIR AND NCCL_LIBRARY)
    set(_nccl_found ON)
    add_library(cupcake_nccl INTERFACE)
    target_include_directories(cupcake_nccl INTERFACE ${NCCL_INCLUDE_DIR})
    target_link_libraries(cupcake_nccl INTERFACE ${NCCL_LIBRARY})
  endif()
endif()
cupcake_resolve(CUPCAKE_WITH_NCCL _nccl_found
  "NCCL needs CUDA and nccl.h/libnccl (set NCCL_INCLUDE_DIR and NCCL_LIBRARY), or -DCUPCAKE_WITH_NCCL=OFF")

set(_cupti_found OFF)
if(CUPCAKE_HAVE_CUDA AND TARGET CUDA::cupti)
  set(_cupti_found ON)
endif()
cupcake_resolve(CUPCAKE_WITH_CUPTI _cupti_found
  "CUPTI needs CUDA and the toolkit's extras/CUPTI, or -DCUPCAKE_WITH_CUPTI=OFF")

set(_mpi_found OFF)
string(TOUPPER "${CUPCAKE_WITH_MPI}" _want_mpi)
if(NOT _want_mpi STREQUAL "OFF")
  find_package(MPI COMPONENTS C)
  if(MPI_C_FOUND)
    set(_mpi_found ON)
  endif()
endif()
cupcake_resolve(CUPCAKE_WITH_MPI _mpi_found
  "install libopenmpi-dev and openmpi-bin (scripts/install-deps.sh), or -DCUPCAKE_WITH_MPI=OFF")

# gloo: Debian's libgloo-dev (headers under gloo/, libgloo.so); its TCP transport only.
set(_gloo_found OFF)
string(TOUPPER "${CUPCAKE_WITH_GLOO}" _want_gloo)
if(NOT _want_gloo STREQUAL "OFF")
  find_path(GLOO_INCLUDE_DIR gloo/rendezvous/context.h)
  find_library(GLOO_LIBRARY gloo)
  if(GLOO_INCLUDE_DIR AND GLOO_LIBRARY)
    set(_gloo_found ON)
  endif()
endif()
cupcake_resolve(CUPCAKE_WITH_GLOO _gloo_found
  "install libgloo-dev (scripts/install-deps.sh) or set GLOO_INCLUDE_DIR and GLOO_LIBRARY, or -DCUPCAKE_WITH_GLOO=OFF")

message(STATUS "Cupcake: CUDA=${CUPCAKE_HAVE_CUDA} NCCL=${CUPCAKE_HAVE_NCCL} CUPTI=${CUPCAKE_HAVE_CUPTI} MPI=${CUPCAKE_HAVE_MPI} GLOO=${CUPCAKE_HAVE_GLOO}")
