#!/usr/bin/env bash
# Installs what the demo and the tests need and a fresh Debian machine
# lacks, from Debian's packages: the PostgreSQL server binaries (the
# throwaway server), and for the tests PgBouncer (their own pooler in
# front of it), Chromium (the console's browser tests) and pg_auto_failover
# (the fault suite's failover under a real HA manager); and, as root,
# the unprivileged user the server runs as (initdb and pgbouncer refuse
# root). `make demo` runs it with "demo", `make test` and .ci/run with
# "test". Without root it installs nothing: it names what is missing.
set -euo pipefail
what=${1:-test}

missing=()
if ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 && ! command -v initdb >/dev/null 2>&1; then
  missing+=(postgresql)
fi
if [ "$what" = test ]; then
  if ! command -v pgbouncer >/dev/null 2>&1 && [ ! -x /usr/sbin/pgbouncer ]; then
    missing+=(pgbouncer)
  fi
  if ! command -v chromium >/dev/null 2>&1; then
    missing+=(chromium)
  fi
fi

install() {
  if [ "$(id -u)" != 0 ]; then
    echo "deps: missing $*: run as root, or: sudo apt-get install -y $*" >&2
    exit 1
  fi
  echo "deps: installing $*"
  export DEBIAN_FRONTEND=noninteractive
  if [ -z "${updated:-}" ]; then
    apt-get update -qq
    updated=1
  fi
  apt-get install -y -qq "$@" >/dev/null
}

if [ ${#missing[@]} -gt 0 ]; then
  install "${missing[@]}"
fi

# pg_auto_failover's package is named for the server's major version.
if [ "$what" = test ] && ! command -v pg_autoctl >/dev/null 2>&1; then
  major=$(ls /usr/lib/postgresql/ 2>/dev/null | sort -n | tail -1)
  install "postgresql-${major:-15}-auto-failover"
fi

if [ "$(id -u)" = 0 ] && ! id postgres >/dev/null 2>&1; then
  useradd --system --no-create-home postgres
fi
