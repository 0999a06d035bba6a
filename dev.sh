#!/usr/bin/env bash
# The project's two commands, each setting up what it needs first:
#   bash dev.sh demo [args]   the periodic-update demo (checks its own result)
#   bash dev.sh test [args]   ruff, then the test suite on up to 4 cores (pytest args
#                             pass through); it lists the 15 slowest tests at the end.
#                             Without args it then runs the jax-triton 0.4 tests in
#                             .venv-jt04 (jax-triton 0.4.1 + triton >= 3.7), whose
#                             install runs in the background beside the main suite
# Both create .venv with Python 3.12 (pyenv reads .python-version) and install
# the package with its test extra. PYTHON=/path/to/python3.12 overrides.
# PALLAS_PINNED_EXTRAS picks the extras (default "test": CPU-only jax); on a GPU
# machine PALLAS_PINNED_EXTRAS=test,cuda,triton gives jax's CUDA plugin and the kernels.
set -euo pipefail
cd "$(dirname "$0")"

find_python() {
  if [ -n "${PYTHON:-}" ]; then echo "$PYTHON"; return; fi
  if command -v pyenv >/dev/null 2>&1 && pyenv which python >/dev/null 2>&1; then
    pyenv which python; return
  fi
  for candidate in python3.12 python3.13 python3; do
    if command -v "$candidate" >/dev/null 2>&1; then command -v "$candidate"; return; fi
  done
  echo "no python found" >&2; exit 1
}

setup() {
  if [ ! -x .venv/bin/python ]; then
    local py; py=$(find_python)
    if ! "$py" -c 'import sys; sys.exit(sys.version_info < (3, 12))'; then
      echo "pallas_pinned needs Python >= 3.12 (jax >= 0.11); $py is $("$py" -V 2>&1)." >&2
      echo "Install 3.12 (e.g. 'pyenv install 3.12') or set PYTHON=/path/to/python3.12." >&2
      exit 1
    fi
    "$py" -m venv .venv
  fi
  # Reinstall only when the project's metadata or the extras changed since the last install.
  local extras=${PALLAS_PINNED_EXTRAS:-test}
  if [ ! -f .venv/.installed ] || [ pyproject.toml -nt .venv/.installed ] \
      || [ "$(cat .venv/.installed)" != "$extras" ]; then
    # pip's own upgrade is skipped (a network round trip and a reinstall, on every fresh
    # clone); pip's wheel cache serves the rest on a machine that installed them once.
    # --no-compile: Python compiles a module when it is first imported, so only what runs
    # is compiled (byte-compiling every installed file took 20 of 50 CPU seconds).
    .venv/bin/python -m pip install -q --disable-pip-version-check --no-compile -e ".[$extras]"
    echo "$extras" > .venv/.installed
  fi
}

setup_jax_triton_04() {
  if [ ! -x .venv-jt04/bin/python ]; then "$(find_python)" -m venv .venv-jt04; fi
  if [ ! -f .venv-jt04/.installed ] || [ pyproject.toml -nt .venv-jt04/.installed ]; then
    # .venv's packages (jax, pytest, ...) are seen after .venv-jt04's own (a .pth file
    # appends them to sys.path), so pip installs only what differs: jax-triton 0.4 and its
    # triton, which shadow .venv's pair. A third of the CPU time of a full second install,
    # spent while the main suite runs.
    local site main_site
    site=$(.venv-jt04/bin/python -c 'import sysconfig; print(sysconfig.get_path("purelib"))')
    main_site=$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_path("purelib"))')
    echo "$main_site" > "$site/_pallas_pinned_main_venv.pth"
    .venv-jt04/bin/python -m pip install -q --disable-pip-version-check --no-compile \
      -e ".[test-jax-triton-04]"
    touch .venv-jt04/.installed
  fi
}

command=${1:-}
shift || true
case "$command" in
  demo) setup; exec .venv/bin/python -m pallas_pinned "$@" ;;
  test)
    setup
    # The suite starts many Python processes (xdist workers, examples, notebook kernels,
    # children): with bytecode written, the first to import jax compiles it and the rest
    # load it (1.3 s an import instead of 3.9 s). Some machines set this variable.
    unset PYTHONDONTWRITEBYTECODE
    # The jax-triton 0.4 environment installs while the main suite runs (mostly
    # download and unpacking, which the suite's compiles leave room for).
    jt04_pid=
    if [ "$#" -eq 0 ]; then
      jt04_log=$(mktemp)
      setup_jax_triton_04 >"$jt04_log" 2>&1 &
      jt04_pid=$!
    fi
    .venv/bin/ruff check .
    # One pytest-xdist worker per core, at most 4 (each imports jax and compiles
    # its own programs); a module stays on one worker (module fixtures run
    # once), in the order conftest.py gives. -n 0 runs in one process.
    workers=$(nproc 2>/dev/null || echo 2)
    if [ "$workers" -gt 4 ]; then workers=4; fi
    status=0
    .venv/bin/python -m pytest --durations=15 -n "$workers" --dist loadfile \
      --no-loadscope-reorder -m "not jax_triton_04" "$@" || status=$?
    if [ "$#" -gt 0 ]; then exit "$status"; fi
    # jax-triton 0.4 needs triton >= 3.7, which cannot sit beside the [triton] pair
    # (jax-triton 0.3.1 + triton 3.6): its tests run in an environment of their own.
    if ! wait "$jt04_pid"; then
      cat "$jt04_log" >&2; echo "installing .venv-jt04 failed" >&2; exit 1
    fi
    rm -f "$jt04_log"
    if [ "$status" -ne 0 ]; then exit "$status"; fi
    exec .venv-jt04/bin/python -m pytest -q -p no:cacheprovider -m jax_triton_04 \
      tests/test_triton_launch.py tests/test_triton_guard.py ;;
  *) echo "usage: bash dev.sh {demo|test} [args...]" >&2; exit 2 ;;
esac
