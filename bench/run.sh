#!/usr/bin/env bash
# The whole side-by-side bench in one command (see bench/README.md):  bench/run.sh [python -m bench options]
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${SENTIN8_VENV:-.venv}/bin/python
if [ ! -x "$PY" ]; then
  echo "bench: no virtualenv at ${SENTIN8_VENV:-.venv}; run ./dev test (or ./dev demo) once to create it" >&2
  exit 2
fi
# root: the PQ toolchain runs in a chroot, inside private mount namespaces
if [ "$(id -u)" -ne 0 ]; then exec sudo -E "$PY" -m bench "$@"; fi
exec "$PY" -m bench "$@"
