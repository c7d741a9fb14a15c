#!/usr/bin/env bash
# What the `mpi` feature needs: OpenMPI (mpirun, libmpi) and libclang for
# rsmpi's bindings, from Debian packages.
set -euo pipefail
dpkg -s openmpi-bin libopenmpi-dev libclang-dev >/dev/null 2>&1 && exit 0
sudo=""
[ "$(id -u)" = 0 ] || sudo="sudo"
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends \
  openmpi-bin libopenmpi-dev libclang-dev >/dev/null
