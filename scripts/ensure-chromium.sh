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
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq >/dev/null
apt-get install -y -qq --no-install-recommends chromium >/dev/null
