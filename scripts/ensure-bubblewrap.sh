#!/usr/bin/env bash
# Installs Debian's bubblewrap (bwrap), which confines every sandbox; quiet when present.
# Without root or apt-get it only says so: sandboxes then fall back to confined processes and
# every result and report records that fallback and what it does not protect.
set -euo pipefail
if command -v bwrap >/dev/null 2>&1; then
  exit 0
fi
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
  echo "ensure-bubblewrap: bwrap is missing and cannot be installed here (needs root + apt-get);" \
    "sandboxes will run as confined processes and say so" >&2
  exit 0
fi
# shellcheck source=scripts/phase.sh
source "$(dirname "$0")/phase.sh"
export DEBIAN_FRONTEND=noninteractive
echo "ensure-bubblewrap: bwrap is missing; installing Debian's bubblewrap (as root, apt-get):" \
  "it confines the workload code of every sandbox (own namespaces, no network)"
phase "ensure-bubblewrap: apt-get update" apt-get update -qq
phase "ensure-bubblewrap: apt-get install bubblewrap" \
  apt-get install -y -qq --no-install-recommends bubblewrap
