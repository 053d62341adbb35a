# Sourced by the Quickstart scripts: makes .venv on first use and re-installs
# the project whenever pyproject.toml changes, so a fresh clone needs nothing
# but Python 3.11+ (and Java 17 for the Spark report).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.venv"
PY="${PYTHON:-python3}"
if ! "$PY" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else 1)' 2>/dev/null; then
    echo "durability-lab needs Python 3.11 or newer; set PYTHON=/path/to/python3.11" >&2
    exit 2
fi
if [ ! -x "$VENV/bin/python" ]; then
    echo "setting up $VENV (first run only)..." >&2
    "$PY" -m venv "$VENV"
fi
# The native record codec (native/, Rust via PyO3) is optional: built when a
# Rust toolchain is present, otherwise the pure-Python codec does the same work
# more slowly. Its sources are part of the stamp, so an edit rebuilds it.
HAVE_CARGO=no
command -v cargo >/dev/null 2>&1 && HAVE_CARGO=yes
STAMP="$VENV/.installed-$( (cat "$ROOT/pyproject.toml"; echo "cargo=$HAVE_CARGO"
    cat "$ROOT"/native/Cargo.* "$ROOT"/native/pyproject.toml "$ROOT"/native/src/*.rs) \
    | sha256sum | cut -c1-16)"
if [ ! -f "$STAMP" ]; then
    "$VENV/bin/python" -m pip install --quiet --upgrade pip >&2
    "$VENV/bin/python" -m pip install --quiet -e "$ROOT[dev]" >&2
    if [ "$HAVE_CARGO" = yes ]; then
        echo "building the native record codec (first run only, about a minute)..." >&2
        "$VENV/bin/python" -m pip install --quiet "$ROOT/native" >&2 \
            || echo "the native record codec did not build: using the pure-Python codec" >&2
    else
        echo "no Rust toolchain (cargo): using the pure-Python record codec" \
             "(correct, slower; see docs/benchmarks.md)" >&2
        "$VENV/bin/python" -m pip uninstall --quiet --yes dlab-native >/dev/null 2>&1 || true
    fi
    rm -f "$VENV"/.installed-*
    touch "$STAMP"
fi
export PATH="$VENV/bin:$PATH"
cd "$ROOT"
