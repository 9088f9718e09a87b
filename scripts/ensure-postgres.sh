#!/usr/bin/env bash
# Makes sure a PostgreSQL server answers on 127.0.0.1:5432 for the shared-store tests (they
# create and drop a database of their own). Quiet when one answers; otherwise installs
# Debian's postgresql (root + apt-get), starts the cluster and lets root in.
set -euo pipefail
answers() { pg_isready -q -h 127.0.0.1 -p 5432 2>/dev/null; }
if command -v pg_isready >/dev/null 2>&1 && answers; then
  exit 0
fi
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
  echo "ensure-postgres: no PostgreSQL on 127.0.0.1:5432 and none can be installed here" \
    "(needs root + apt-get); start one with trust auth for root" >&2
  exit 0
fi
# shellcheck source=scripts/phase.sh
source "$(dirname "$0")/phase.sh"
if ! command -v pg_ctlcluster >/dev/null 2>&1; then
  export DEBIAN_FRONTEND=noninteractive
  echo "ensure-postgres: no PostgreSQL; installing Debian's postgresql (as root, apt-get):" \
    "the shared-store tests run the experiment and effect ledgers on it"
  phase "ensure-postgres: apt-get update" apt-get update -qq
  phase "ensure-postgres: apt-get install postgresql" \
    apt-get install -y -qq --no-install-recommends postgresql
fi
version=$(ls /etc/postgresql | sort -n | tail -1)
started() {
  pg_ctlcluster --skip-systemctl-redirect "$version" main start || true
  for _ in $(seq 1 30); do
    answers && return 0
    sleep 1
  done
  return 1
}
phase "ensure-postgres: starting PostgreSQL $version on 127.0.0.1:5432" started
# a fresh cluster knows only the postgres role: let root in, as the tests connect as root
su postgres -c "psql -qtAc \"SELECT 1 FROM pg_roles WHERE rolname = 'root'\"" | grep -q 1 \
  || su postgres -c "createuser --superuser root"
