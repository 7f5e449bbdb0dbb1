#!/usr/bin/env bash
# A throwaway PostgreSQL server for the tests (docs/scale.md), from Debian's packages.
#
#   scripts/postgres.sh start DIR   initdb + start on a free loopback port, data in DIR, TLS on
#                                   with a certificate for 127.0.0.1 from a throwaway CA; prints
#                                   `export ROTA_TEST_PG=postgres://…` and
#                                   `export ROTA_TEST_PG_CA=DIR/ca.crt` for eval
#   scripts/postgres.sh stop DIR    stops it (DIR is left for the caller to remove)
#
# Installs the `postgresql` package when the server binaries are missing. As root, the server
# runs as the `postgres` user (PostgreSQL refuses to run as root). ROTA_PG_OPTIONS adds server
# settings (`-c name=value …`), after and over the test defaults (scripts/capacity.py turns
# fsync back on and loads pg_stat_statements).
set -euo pipefail
cmd=${1:?usage: postgres.sh start|stop DIR}
dir=$(realpath -m "${2:?usage: postgres.sh start|stop DIR}")

bindir() {
    local d
    d=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n1 || true)
    if [[ -z "$d" || ! -x "$d/initdb" ]]; then
        local sudo=""
        [[ $(id -u) -eq 0 ]] || sudo="sudo"
        $sudo apt-get update -qq >&2
        DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends postgresql >&2
        d=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -n1)
    fi
    printf '%s\n' "$d"
}

as_owner() {
    # From /: the postgres user may not enter the caller's directory.
    if [[ $(id -u) -eq 0 ]]; then (cd / && runuser -u postgres -- "$@"); else "$@"; fi
}

case "$cmd" in
start)
    bin=$(bindir)
    mkdir -p "$dir"
    [[ $(id -u) -ne 0 ]] || chown postgres "$dir"
    port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
    as_owner "$bin/initdb" -D "$dir/data" -A trust -U rota >/dev/null
    # TLS, so that tests can connect with sslmode=verify-full (the certificate is its own CA).
    command -v openssl >/dev/null || {
        sudo=""
        [[ $(id -u) -eq 0 ]] || sudo="sudo"
        DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends openssl >&2
    }
    openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj /CN=rota-test-ca \
        -keyout "$dir/ca.key" -out "$dir/ca.crt" 2>/dev/null
    openssl req -newkey rsa:2048 -nodes -subj /CN=127.0.0.1 -keyout "$dir/server.key" -out "$dir/server.csr" 2>/dev/null
    printf 'subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\n' > "$dir/server.ext"
    openssl x509 -req -in "$dir/server.csr" -CA "$dir/ca.crt" -CAkey "$dir/ca.key" -CAcreateserial -days 2 \
        -extfile "$dir/server.ext" -out "$dir/server.crt" 2>/dev/null
    chmod 600 "$dir/server.key"
    [[ $(id -u) -ne 0 ]] || chown postgres "$dir/server.key" "$dir/server.crt"
    # Enough connections for many instances in parallel tests; fsync off: the data is thrown away.
    as_owner "$bin/pg_ctl" -D "$dir/data" -l "$dir/pg.log" -w -o \
        "-p $port -k $dir -c listen_addresses=127.0.0.1 -c max_connections=400 -c fsync=off -c ssl=on \
         -c ssl_cert_file=$dir/server.crt -c ssl_key_file=$dir/server.key ${ROTA_PG_OPTIONS:-}" start >/dev/null
    echo "export ROTA_TEST_PG=postgres://rota@127.0.0.1:$port/postgres"
    echo "export ROTA_TEST_PG_CA=$dir/ca.crt"
    ;;
stop)
    bin=$(bindir)
    as_owner "$bin/pg_ctl" -D "$dir/data" -m fast -w stop >/dev/null
    ;;
*)
    echo "usage: postgres.sh start|stop DIR" >&2
    exit 2
    ;;
esac
