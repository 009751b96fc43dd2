# Sourced by scripts/demo, scripts/example, scripts/test and scripts/test-lowest: makes
# the venv $VENV (.venv unless set) in the checkout if it is missing, with a Python 3.11+
# ($PYTHON, else python3) and the pip that requirements/pip.txt pins. A Python without
# ensurepip (Debian's, without the python3-venv package) gets a venv without pip, which
# the system's pip then fills.
VENV=${VENV:-.venv}
PY=${PYTHON:-python3}

make_venv() {
  if [ ! -x "$VENV/bin/python" ]; then
    if ! "$PY" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
      echo "Fairlane needs Python 3.11 or newer: set PYTHON to one (found: $("$PY" --version 2>&1))" >&2
      exit 2
    fi
    if ! "$PY" -m venv "$VENV" 2>/dev/null; then
      rm -rf "$VENV"
      "$PY" -m venv --without-pip "$VENV"
      "$PY" -m pip --python "$VENV/bin/python" install --quiet --require-hashes -r requirements/pip.txt
    fi
    VENV_MADE=1
  fi
  "$VENV/bin/python" -m pip install --quiet --require-hashes -r requirements/pip.txt
}

# install_lock LOCK: makes $VENV hold exactly what LOCK names, then Fairlane itself from
# the checkout (editable, built by the backend the lock holds, so nothing unlocked is
# fetched to build it). pip adds and replaces packages but never removes one, so a venv
# filled from another lock, or from none (scripts/demo's), is made anew: the venv keeps
# a note of the lock it was filled from. Modules are compiled when first imported, not
# all at install time.
install_lock() {
  local lock=$1 note
  note=$(cat "$lock" requirements/pip.txt | sha256sum)
  if [ "$(cat "$VENV/.fairlane-lock" 2>/dev/null)" != "$note" ]; then
    if [ -z "${VENV_MADE:-}" ]; then
      echo "making $VENV anew from $lock"
      rm -rf "$VENV"
      make_venv
    fi
    "$VENV/bin/python" -m pip install --quiet --no-compile --require-hashes -r "$lock"
    echo "$note" >"$VENV/.fairlane-lock"
  fi
  "$VENV/bin/python" -m pip install --quiet --no-compile --no-deps --no-build-isolation -e .
}

make_venv
