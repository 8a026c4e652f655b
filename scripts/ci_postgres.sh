#!/usr/bin/env bash
# A throw-away PostgreSQL for the test suite's second engine (tests/pgkit.py).
# Source it (". scripts/ci_postgres.sh"): it installs the Debian server package when
# initdb is missing (root + apt-get), creates a cluster in a temp dir (initdb refuses
# root, so the cluster belongs to the "postgres" user when run as root), starts it on
# a free 127.0.0.1 port with trust auth, enables pg_trgm, exports
# PG_TROVE_TEST_URL and PG_TROVE_REQUIRE=1 (the PostgreSQL tests then fail rather
# than skip), and stops the server and removes the dir when the sourcing shell exits.
trove_pg_bindir() {   # the Debian package's newest server, else whatever is on PATH
  local found
  found="$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1)"
  if [ -z "$found" ] && command -v pg_ctl >/dev/null 2>&1; then
    found="$(dirname "$(command -v pg_ctl)")"
  fi
  echo "$found"
}

trove_pg_start() {
  local bindir port dir owner
  bindir="$(trove_pg_bindir)"
  if [ -z "$bindir" ] || [ ! -x "$bindir/initdb" ]; then
    if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
      echo "ci_postgres: installing the postgresql package" >&2
      apt-get update -qq >/dev/null 2>&1 || true
      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null 2>&1 \
        || { echo "ci_postgres: apt-get install postgresql failed" >&2; return 1; }
      bindir="$(trove_pg_bindir)"
    fi
  fi
  if [ -z "$bindir" ] || [ ! -x "$bindir/initdb" ]; then
    echo "ci_postgres: no PostgreSQL server binaries (initdb, pg_ctl) and cannot install them" >&2
    return 1
  fi
  port="$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
  dir="$(mktemp -d /tmp/trove-ci-pg.XXXXXX)"
  owner=""
  if [ "$(id -u)" = "0" ]; then
    id postgres >/dev/null 2>&1 || useradd --system --home-dir "$dir" postgres
    chown postgres "$dir"
    owner="runuser -u postgres --"
  fi
  chmod 700 "$dir"
  $owner "$bindir/initdb" -D "$dir/data" -A trust -U postgres --no-sync -E UTF8 \
    >"$dir/initdb.log" 2>&1 || { cat "$dir/initdb.log" >&2; return 1; }
  $owner "$bindir/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w -t 60 \
    -o "-c listen_addresses=127.0.0.1 -p $port -k $dir -c fsync=off -c max_connections=200" \
    start >/dev/null || { cat "$dir/server.log" >&2; return 1; }
  TROVE_CI_PG_STOP="$owner $bindir/pg_ctl -D $dir/data -m fast -w stop"
  TROVE_CI_PG_DIR="$dir"
  trap trove_pg_stop EXIT
  export PATH="$bindir:$PATH"   # pg_dump of the same version for the backup tests
  export PG_TROVE_TEST_URL="postgresql://postgres@127.0.0.1:$port/postgres"
  export PG_TROVE_REQUIRE=1
  "$bindir/psql" -q -h 127.0.0.1 -p "$port" -U postgres -d postgres \
    -c "CREATE EXTENSION IF NOT EXISTS pg_trgm SCHEMA public" >/dev/null
  echo "ci_postgres: PostgreSQL $("$bindir/pg_ctl" --version | awk '{print $3}') on 127.0.0.1:$port" >&2
}

trove_pg_stop() {
  if [ -n "${TROVE_CI_PG_STOP:-}" ]; then
    $TROVE_CI_PG_STOP >/dev/null 2>&1 || true
    rm -rf "$TROVE_CI_PG_DIR"
    TROVE_CI_PG_STOP=""
  fi
}

trove_pg_start
