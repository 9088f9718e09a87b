#!/usr/bin/env bash
# Builds the virtual environment the Makefile's targets run from, one line per phase with
# its elapsed time (pip's own output goes to <venv>/install.log, shown if a phase fails).
#   runtime  ForkLab and what its demos need (`make demo`)
#   dev      also every provider extra and the test and lint tools (`make test`)
# pip reads its usual configuration: with a local wheel cache or index it downloads nothing.
set -euo pipefail
what=${1:-runtime}
PY=${PY:-python3}
VENV=${VENV:-.venv}
case $what in
  runtime)
    target=.
    why="ForkLab and its runtime dependencies (the Temporal SDK and dev server, numpy, scipy, matplotlib, the OpenAI Agents SDK; about 60 packages)"
    ;;
  dev)
    target='.[dev]'
    why="ForkLab with every extra (Daytona, Braintrust, boto3, psycopg, LangGraph) and the test tools (pytest, mypy, ruff, moto, …; about 190 packages)"
    ;;
  *)
    echo "install.sh: say runtime or dev, not '$what'" >&2
    exit 2
    ;;
esac
mkdir -p "$VENV"
PHASE_LOG=$(cd "$VENV" && pwd)/install.log
# shellcheck source=scripts/phase.sh
source "$(dirname "$0")/phase.sh"
start=$SECONDS
echo "install: building $VENV ($what; pip's output in $PHASE_LOG)"
if [ ! -x "$VENV/bin/python" ]; then
  phase "install: 1/3 creating $VENV with $($PY --version 2>&1)" "$PY" -m venv "$VENV"
else
  echo "install: 1/3 $VENV exists; reusing it"
fi
phase "install: 2/3 upgrading pip" "$VENV/bin/python" -m pip install --upgrade pip
phase "install: 3/3 installing $why" "$VENV/bin/python" -m pip install -e "$target"
size=$(du -sh "$VENV" 2>/dev/null | cut -f1)
echo "install: $VENV ready for $what in $((SECONDS - start)) s ($size)"
