# shellcheck shell=bash
# postgres: PostgreSQL from Debian's packages (storage for a scale-out Dagster), a user process on 127.0.0.1
# only, TCP with scram passwords, no Unix socket, data under the services dir. Postgres refuses to run as root,
# so as root the cluster belongs to and runs as $LAZYHIPPO_PG_OS_USER.
#   LAZYHIPPO_PG_PORT      [15432: off the default, so a system cluster can coexist]
#   LAZYHIPPO_PG_USER      login role owning the database [lazyhippo]
#   LAZYHIPPO_PG_PASSWORD  [random per install]
#   LAZYHIPPO_PG_DB        [dagster]
#                          (these four are recorded in credentials.env; set them before the first install)
#   LAZYHIPPO_PG_OS_USER   OS user that owns and runs the cluster when run as root [postgres, from the package]
PG_DIR="$SERVICES_DIR/postgres"
PG_DATA="$PG_DIR/data"
PG_LOG="$PG_DIR/postgres.log"
PG_PID_FILE="$RUN_DIR/postgres.pid"
PG_PATTERN="bin/postgres -D $PG_DATA"
PG_OS_USER="${LAZYHIPPO_PG_OS_USER:-postgres}"
credential LAZYHIPPO_PG_PORT 15432
# setpriv execs (runuser/su fork), so the launcher's pid file names the postmaster itself.
PG_AS=()
((EUID != 0)) || PG_AS=(setpriv "--reuid=$PG_OS_USER" "--regid=$PG_OS_USER" --init-groups --)

credentials_postgres() {
    credential LAZYHIPPO_PG_USER lazyhippo
    credential LAZYHIPPO_PG_DB dagster
    secret LAZYHIPPO_PG_PASSWORD "$PG_DATA/PG_VERSION" \
        "postgres: $PG_DATA was initialized with a password not in $CREDENTIALS_FILE: set LAZYHIPPO_PG_PASSWORD once (or stop postgres and delete $PG_DATA)"
    record_credentials LAZYHIPPO_PG_USER LAZYHIPPO_PG_PASSWORD LAZYHIPPO_PG_PORT LAZYHIPPO_PG_DB
}

# pg_bin: the binaries of the data directory's major version, else the newest installed.
pg_bin() {
    local d
    if [[ -f "$PG_DATA/PG_VERSION" ]]; then
        d="/usr/lib/postgresql/$(cat "$PG_DATA/PG_VERSION")/bin"
    else
        d="$(find /usr/lib/postgresql -maxdepth 2 -name bin 2>/dev/null | sort -V | tail -n 1)"
    fi
    [[ -x "$d/initdb" ]] && printf '%s' "$d"
}

postgres_installed() { [[ -f "$PG_DATA/PG_VERSION" && -n "$(pg_bin)" ]]; }

pg_run() { (cd "$PG_DIR" && "${PG_AS[@]}" "$@"); } # as the cluster's owner, from a directory it can enter

pg_bootstrap_sql() {
    local q="'" dq='"' user
    user="${LAZYHIPPO_PG_USER//$dq/$dq$dq}"
    printf 'CREATE ROLE "%s" LOGIN PASSWORD %s;\n' "$user" "$q${LAZYHIPPO_PG_PASSWORD//$q/$q$q}$q"
    printf 'CREATE DATABASE "%s" OWNER "%s";\n' "${LAZYHIPPO_PG_DB//$dq/$dq$dq}" "$user"
}

install_postgres() {
    [[ -n "$(pg_bin)" ]] || apt_install postgres postgresql
    local bin tmp="$PG_DIR/data.tmp" install_log="$SERVICES_DIR/postgres-install.log"
    bin="$(pg_bin)" || die "postgres: no initdb for the PostgreSQL version of $PG_DATA under /usr/lib/postgresql"
    if postgres_installed; then
        log "postgres: PostgreSQL $(cat "$PG_DATA/PG_VERSION") already initialized in $PG_DATA"
        return 0
    fi
    ((EUID != 0)) || getent passwd "$PG_OS_USER" >/dev/null || die "postgres: OS user $PG_OS_USER not found (set LAZYHIPPO_PG_OS_USER)"
    mkdir -p "$PG_DIR"
    ((EUID != 0)) || chown "$PG_OS_USER:" "$PG_DIR"
    pg_run test -w . || die "postgres: $PG_OS_USER cannot write $PG_DIR (each parent directory must be searchable by it)"
    log "postgres: initializing a PostgreSQL $(basename "$(dirname "$bin")") cluster in $PG_DATA"
    rm -rf "$tmp"
    # Role and database are made in single-user mode: the password goes through stdin, never argv, a socket
    # or a log line (no statement is logged, even on error).
    if ! { pg_run "$bin/initdb" -D "$tmp" -E UTF8 --no-locale --auth-local=peer --auth-host=scram-sha-256 &&
        pg_bootstrap_sql | pg_run "$bin/postgres" --single -D "$tmp" -c log_min_error_statement=panic postgres; } \
        >"$install_log" 2>&1 || grep -q 'ERROR:' "$install_log"; then
        show_log_tail "$install_log"
        die "postgres: initdb failed (full log: $install_log)"
    fi
    mv "$tmp" "$PG_DATA"
    log "postgres: installed (database $LAZYHIPPO_PG_DB, owner $LAZYHIPPO_PG_USER)"
}

pg_ready() { [[ -n "$(pg_bin)" ]] && "$(pg_bin)/pg_isready" -q -h 127.0.0.1 -p "$LAZYHIPPO_PG_PORT"; }
pg_login() {
    PGPASSWORD="$LAZYHIPPO_PG_PASSWORD" PGCONNECT_TIMEOUT=3 "$(pg_bin)/psql" -h 127.0.0.1 -p "$LAZYHIPPO_PG_PORT" \
        -U "$LAZYHIPPO_PG_USER" -d "$LAZYHIPPO_PG_DB" -Atqc 'SELECT 1' >/dev/null 2>&1
}
wait_postgres() {
    wait_ready postgres "$PG_PID_FILE" "$PG_PATTERN" "$PG_LOG" pg_login \
        "postgresql://$LAZYHIPPO_PG_USER@127.0.0.1:$LAZYHIPPO_PG_PORT/$LAZYHIPPO_PG_DB"
}

start_postgres() {
    already_running postgres "$PG_PID_FILE" "$PG_PATTERN" wait_postgres && return 0
    postgres_installed || die "postgres: not installed: run '$0 install postgres' first"
    port_taken postgres "$LAZYHIPPO_PG_PORT" LAZYHIPPO_PG_PORT pg_login " (login ok)" && return 0
    log "postgres: starting PostgreSQL $(cat "$PG_DATA/PG_VERSION") on 127.0.0.1:$LAZYHIPPO_PG_PORT (data $PG_DATA)"
    (cd "$PG_DIR" && launch "$PG_PID_FILE" "$PG_LOG" "${PG_AS[@]}" "$(pg_bin)/postgres" -D "$PG_DATA" \
        -h 127.0.0.1 -p "$LAZYHIPPO_PG_PORT" -k '') # -k '': no Unix socket
    wait_postgres
}

status_postgres() {
    status_line postgres "$PG_PID_FILE" "$PG_PATTERN" pg_ready "postgresql://127.0.0.1:$LAZYHIPPO_PG_PORT" \
        "not accepting connections on port $LAZYHIPPO_PG_PORT yet"
}

# SIGINT is postgres' fast shutdown (SIGTERM would wait for every client to disconnect).
stop_postgres() { stop_pid postgres "$PG_PID_FILE" "$PG_PATTERN" INT; }
