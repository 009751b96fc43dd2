# Sourced by scripts/demo, scripts/example and scripts/test: makes .venv in the
# checkout (if missing) with a Python 3.11+ ($PYTHON, else python3) and a pip of its
# own. A Python without ensurepip (Debian's, without the python3-venv package) gets a
# venv without pip, which the system's pip then fills.
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  if ! "$PY" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
    echo "Fairlane needs Python 3.11 or newer: set PYTHON to one (found: $("$PY" --version 2>&1))" >&2
    exit 2
  fi
  if ! "$PY" -m venv .venv 2>/dev/null; then
    rm -rf .venv
    "$PY" -m venv --without-pip .venv
    "$PY" -m pip --python .venv/bin/python install --quiet pip
  fi
fi
.venv/bin/python -m pip install --quiet --upgrade pip
