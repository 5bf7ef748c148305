# Sourced by bin/test, bin/demo and bin/bench: create .venv and install the project.
# A torch importable by the base Python (a training image) is used as is, through
# --system-site-packages; otherwise a CPU build is installed into the venv.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${COSMOS_PROFILER_VENV:-$ROOT/.venv}"
EXTRAS="${1:-}"
PY="${PYTHON:-python3}"
TORCH_CPU_VERSION="${TORCH_CPU_VERSION:-2.13.0}"

if [ ! -x "$VENV/bin/python" ]; then
    if "$PY" -c "import torch" >/dev/null 2>&1; then
        echo "[setup] creating $VENV on top of the torch already installed for $PY" >&2
        "$PY" -m venv --system-site-packages "$VENV"
    else
        echo "[setup] creating $VENV" >&2
        "$PY" -m venv "$VENV"
    fi
fi
# shellcheck disable=SC1091
. "$VENV/bin/activate"
export PIP_DISABLE_PIP_VERSION_CHECK=1
if ! python -c "import torch" >/dev/null 2>&1; then
    echo "[setup] no importable torch: installing the CPU build torch==$TORCH_CPU_VERSION" >&2
    python -m pip install -q "torch==$TORCH_CPU_VERSION"
fi
HASH="$(python -c 'import hashlib,sys;print(hashlib.sha256(open(sys.argv[1],"rb").read()).hexdigest()[:12])' "$ROOT/pyproject.toml")"
STAMP="$VENV/.installed-$HASH${EXTRAS:+-$EXTRAS}"
# Without extras (bin/demo, bin/gpu-check), an install of this pyproject.toml with extras will do.
if [ ! -f "$STAMP" ] && ! { [ -z "$EXTRAS" ] && compgen -G "$VENV/.installed-$HASH-*" >/dev/null; }; then
    echo "[setup] installing cosmos-profiler-sidecar${EXTRAS:+[$EXTRAS]} (editable)" >&2
    python -m pip install -q -e "$ROOT${EXTRAS:+[$EXTRAS]}"
    touch "$STAMP"
fi
