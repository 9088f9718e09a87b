#!/usr/bin/env bash
# Installs Debian's chromium for the HTML report's browser test, once; quiet when present.
# Without root or apt-get it only says so; the browser test then fails with the same advice.
set -euo pipefail
if command -v chromium >/dev/null 2>&1 || [ -x /usr/bin/chromium ]; then
  exit 0
fi
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
  echo "ensure-chromium: chromium is missing and cannot be installed here (needs root + apt-get)" >&2
  exit 0
fi
# shellcheck source=scripts/phase.sh
source "$(dirname "$0")/phase.sh"
export DEBIAN_FRONTEND=noninteractive
echo "ensure-chromium: chromium is missing; installing Debian's chromium (as root, apt-get):" \
  "the HTML report's screenshot test renders report.html in it"
phase "ensure-chromium: apt-get update" apt-get update -qq
phase "ensure-chromium: apt-get install chromium" \
  apt-get install -y -qq --no-install-recommends chromium
