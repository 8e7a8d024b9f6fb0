#!/usr/bin/env bash
# Prepares a machine to build, test and run torchsparse_pp, from a fresh clone:
#   1. system libraries (libusb-1.0 for open3d, the `io` extra),
#   2. torch (the CPU wheel 2.13.0 by default),
#   3. build tools, then the extension itself, editable, with the extras in $EXTRAS.
#
# Overrides (environment):
#   PYTHON=python3            interpreter to install into
#   TORCH_SPEC="torch==2.13.0"  what pip installs for torch; e.g. "torch==2.11.0", or "skip" to keep yours
#   EXTRAS=test,triton        extras of this package to install ("test", "test,io", "" for none)
#   MAX_JOBS=2                parallel compile jobs for the extension
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
TORCH_SPEC=${TORCH_SPEC:-torch==2.13.0}
EXTRAS=${EXTRAS-test,triton}
export MAX_JOBS=${MAX_JOBS:-$(nproc)}
pip_install() { "$PYTHON" -m pip install --disable-pip-version-check -q "$@"; }

echo "[setup] system libraries"
if ! ldconfig -p 2>/dev/null | grep -q "libusb-1.0.so.0"; then
  if command -v apt-get >/dev/null 2>&1; then
    SUDO=""
    if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq libusb-1.0-0 >/dev/null
  else
    echo "[setup] warning: no apt-get; install libusb-1.0 yourself if you use the 'io' extra (open3d)" >&2
  fi
fi

if [ "$TORCH_SPEC" != "skip" ]; then
  echo "[setup] $TORCH_SPEC"
  pip_install "$TORCH_SPEC"
fi
"$PYTHON" -c "import torch; print('[setup] using torch', torch.__version__)"
torch_version() { "$PYTHON" -c "import torch; print(torch.__version__)"; }
TORCH_BEFORE=$(torch_version)

echo "[setup] build tools"
pip_install "setuptools>=77" wheel ninja numpy

echo "[setup] building torchsparse_pp (extras: ${EXTRAS:-none})"
target="."
if [ -n "$EXTRAS" ]; then target=".[$EXTRAS]"; fi
# No build isolation: the build must use the torch installed above, not download another one.
pip_install --no-build-isolation -e "$target"
# The test extra holds torch_geometric 2.8.1 (the R-GCN peer); it must not have replaced torch.
if [ "$(torch_version)" != "$TORCH_BEFORE" ]; then
  echo "[setup] error: installing the extras replaced torch $TORCH_BEFORE with $(torch_version)" >&2
  exit 1
fi
"$PYTHON" -c "import torchsparse_pp; print('[setup] torchsparse_pp', torchsparse_pp.__version__, 'ready')"
