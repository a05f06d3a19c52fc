#!/usr/bin/env bash
# Packs this machine's Open MPI (Debian's 4.1 with its external PMIx) into DIR (default .mpipack)
# for a GPU machine whose image has no MPI: mpirun and orted, the MCA components the testbed and
# the tests use (tcp, self and vader for MPI; the rsh launcher), their help and parameter files,
# PMIx, and every library they load except the C library. `source DIR/env.sh` there puts it first
# on PATH and LD_LIBRARY_PATH and points Open MPI's and PMIx's install paths (OPAL_*, PMIX_*) at DIR;
# scripts/testbed.sh's agent passes that environment on to the daemons it starts.
# Left out: the components for InfiniBand, UCX, OFI and PSM (their libraries are large and the GPU
# machine has no such fabric; DIR's parameter file excludes them as Debian's does).
# Usage: bench/gpu/mpi-pack.sh [DIR]
set -euo pipefail
out="${1:-.mpipack}"
arch=x86_64-linux-gnu
ompi=/usr/lib/$arch/openmpi pmix=/usr/lib/$arch/pmix2
for f in /usr/bin/orterun /usr/bin/orted /usr/lib/$arch/libmpi.so.40 "$pmix/lib/libpmix.so.2"; do
  [ -e "$f" ] || { echo "mpi-pack.sh: $f: missing (apt-get install openmpi-bin libopenmpi-dev)" >&2; exit 2; }
done
rm -rf "$out" && mkdir -p "$out/bin" "$out/lib" "$out/etc" "$out/share"
cp /usr/bin/orterun /usr/bin/orted "$out/bin/"
ln -s orterun "$out/bin/mpirun"
# The libraries keep their directory shape under DIR, which is what OPAL_PREFIX relocates.
mkdir -p "$out/usr/lib/$arch"
cp -a "$ompi" "$out/usr/lib/$arch/"
rm -rf "$out/usr/lib/$arch/openmpi/include" "$out/usr/lib/$arch/openmpi/lib/pkgconfig"
find "$out/usr/lib/$arch/openmpi" -type l -delete  # links to the libraries below, which go into DIR/lib
cp -L /usr/lib/$arch/libmpi.so.40 /usr/lib/$arch/libopen-rte.so.40 /usr/lib/$arch/libopen-pal.so.40 "$out/lib/"
find "$out/usr/lib/$arch/openmpi" \( -name "*.a" -o -name "*java*" -o -name "*oshmem*" \
  -o -name "*_ucx*" -o -name "*_ofi*" -o -name "*openib*" -o -name "*verbs*" -o -name "*psm*" \) -exec rm -rf {} +
mkdir -p "$out/usr/lib/$arch/pmix2"
cp -a "$pmix/lib" "$pmix/share" "$out/usr/lib/$arch/pmix2/"
rm -f "$out/usr/lib/$arch/pmix2/lib/"*.a
cp -a /usr/share/openmpi "$out/share/"
cp -a /etc/openmpi "$out/etc/"
# Every library those load, by name, beside them (the C library and the loader are the machine's).
find "$out/bin" "$out/usr" -type f \( -perm -u+x -o -name "*.so*" \) -print0 |
  xargs -0 ldd 2>/dev/null | awk '$3 ~ /^\// {print $3}' | sort -u | while read -r lib; do
    case "$(basename "$lib")" in
      libc.so*|libm.so*|libdl.so*|libpthread.so*|librt.so*|ld-linux*) ;;
      *) [ -e "$out/lib/$(basename "$lib")" ] || cp -L "$lib" "$out/lib/" ;;
    esac
  done
cat >"$out/env.sh" <<'ENV'
# Sourced (bash): this pack's Open MPI on PATH and LD_LIBRARY_PATH, its install paths relocated.
mpipack=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
export PATH="$mpipack/bin:$PATH"
# First: a machine with an Open MPI of its own (another version) must not lend this one its
# libraries (mpirun, its components and the ranks load one Open MPI and one PMIx, all of this pack).
export LD_LIBRARY_PATH="$mpipack/usr/lib/x86_64-linux-gnu/openmpi/lib:$mpipack/usr/lib/x86_64-linux-gnu/pmix2/lib:$mpipack/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export OPAL_PREFIX="$mpipack/usr" OPAL_EXEC_PREFIX="$mpipack/usr" OPAL_BINDIR="$mpipack/bin"
export OPAL_LIBDIR="$mpipack/usr/lib/x86_64-linux-gnu/openmpi/lib"
export OPAL_PKGLIBDIR="$OPAL_LIBDIR/openmpi3" OPAL_SYSCONFDIR="$mpipack/etc/openmpi"
export OPAL_DATAROOTDIR="$mpipack/share" OPAL_DATADIR="$mpipack/share" OPAL_PKGDATADIR="$mpipack/share/openmpi"
export PMIX_PREFIX="$mpipack/usr/lib/x86_64-linux-gnu/pmix2" PMIX_EXEC_PREFIX="$mpipack/usr/lib/x86_64-linux-gnu/pmix2"
export PMIX_LIBDIR="$PMIX_PREFIX/lib" PMIX_PKGLIBDIR="$PMIX_PREFIX/lib/pmix"
ENV
echo "mpi-pack.sh: $(du -sh "$out" | cut -f1) in $out"
