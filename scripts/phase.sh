# Sourced by the install scripts: `phase LABEL COMMAND...` runs one phase of an install and
# prints one line for it, "LABEL … done (N s)"; the command's own output (pip's, apt-get's)
# goes to $PHASE_LOG and is shown only when the phase fails.
PHASE_LOG=${PHASE_LOG:-${TMPDIR:-/tmp}/forklab-install.log}

phase() {
  local label=$1
  shift
  local t0=$SECONDS
  printf '%s … ' "$label"
  if "$@" >>"$PHASE_LOG" 2>&1; then
    echo "done ($((SECONDS - t0)) s)"
  else
    local code=$?
    echo "failed (exit $code) after $((SECONDS - t0)) s; the end of $PHASE_LOG:"
    tail -n 20 "$PHASE_LOG" >&2
    exit "$code"
  fi
}
