# shellcheck shell=bash
# minio: MinIO built from source with `go install` (Go's module and build caches make a reinstall a relink),
# S3 API on 127.0.0.1.
#   MINIO_ROOT_USER          [lazyhippo, kept in credentials.env]
#   MINIO_ROOT_PASSWORD      >= 8 chars [random per install, kept in credentials.env]
#   MINIO_PORT               S3 API port [9000]
#   MINIO_CONSOLE_PORT       console address (the console is off unless MINIO_BROWSER=on) [9001]
#   LAZYHIPPO_MINIO_VERSION  pin override
# The RELEASE.* tags are not served by the Go module proxy reachable here (403), so pin the module proxy's
# pseudo-version of the last upstream commit (2026-02-12, go 1.24, no replaces).
MINIO_VERSION="${LAZYHIPPO_MINIO_VERSION:-v0.0.0-20260212201848-7aac2a2c5b7c}"
MINIO_DIR="$SERVICES_DIR/minio"
MINIO_BIN="$MINIO_DIR/bin/minio"
MINIO_DATA="$MINIO_DIR/data"
MINIO_LOG="$MINIO_DIR/minio.log"
MINIO_PID_FILE="$RUN_DIR/minio.pid"
MINIO_PORT="${MINIO_PORT:-9000}"
MINIO_CONSOLE_PORT="${MINIO_CONSOLE_PORT:-9001}"
MINIO_PATTERN="minio server"

credentials_minio() {
    credential MINIO_ROOT_USER lazyhippo
    secret MINIO_ROOT_PASSWORD "$MINIO_DATA/.minio.sys" \
        "minio: $MINIO_DATA was initialized with credentials not in $CREDENTIALS_FILE: set MINIO_ROOT_USER / MINIO_ROOT_PASSWORD once"
    record_credentials MINIO_ROOT_USER MINIO_ROOT_PASSWORD
}

minio_installed() { [[ -x "$MINIO_BIN" && -f "$MINIO_DIR/.installed" && "$(cat "$MINIO_DIR/.installed")" == "$MINIO_VERSION" ]]; }

install_minio() {
    if minio_installed; then
        log "minio: $MINIO_VERSION already installed at $MINIO_BIN"
        return 0
    fi
    need go "go not found: building MinIO needs Go 1.24+ on PATH"
    local v build_log="$SERVICES_DIR/minio-install.log" rc=0
    v="$(go env GOVERSION 2>/dev/null || true)"
    v="${v#go}"
    if ! [[ "$v" =~ ^([0-9]+)\.([0-9]+) ]] || ((BASH_REMATCH[1] == 1 && BASH_REMATCH[2] < 24)); then
        die "Go ${v:-unknown} found, but building MinIO needs Go 1.24+"
    fi
    if pid_alive "$MINIO_PID_FILE" "$MINIO_PATTERN" >/dev/null; then
        die "minio: a different version is running; run '$0 stop minio' before reinstalling"
    fi
    log "minio: building github.com/minio/minio@$MINIO_VERSION (first run: ~4-5 min, ~1.2 GB module cache)"
    mkdir -p "$MINIO_DIR/bin"
    (cd "$MINIO_DIR" && CGO_ENABLED=0 GOTOOLCHAIN=local GOFLAGS='' GOBIN="$MINIO_DIR/bin" \
        go install -trimpath -ldflags='-s -w' "github.com/minio/minio@$MINIO_VERSION") >"$build_log" 2>&1 || rc=$?
    if ((rc != 0)) || [[ ! -x "$MINIO_BIN" ]]; then
        show_log_tail "$build_log"
        die "minio: go install failed (full log: $build_log)"
    fi
    printf '%s' "$MINIO_VERSION" >"$MINIO_DIR/.installed"
    log "minio: installed $MINIO_BIN"
}

minio_ready() { curl -fsS -m 3 -o /dev/null "http://127.0.0.1:$MINIO_PORT/minio/health/ready" 2>/dev/null; }
minio_live() { curl -fsS -m 3 -o /dev/null "http://127.0.0.1:$MINIO_PORT/minio/health/live" 2>/dev/null; }
wait_minio() { wait_ready minio "$MINIO_PID_FILE" "$MINIO_PATTERN" "$MINIO_LOG" minio_ready "http://127.0.0.1:$MINIO_PORT"; }

start_minio() {
    need curl "curl not found (needed for the MinIO health check; apt-get install curl)"
    already_running minio "$MINIO_PID_FILE" "$MINIO_PATTERN" wait_minio && return 0
    minio_installed || die "minio: not installed (or version changed): run '$0 install minio' first"
    port_taken minio "$MINIO_PORT" MINIO_PORT minio_ready " (credentials not checked)" && return 0
    ((${#MINIO_ROOT_USER} >= 3)) || die "minio: MINIO_ROOT_USER must be at least 3 characters"
    ((${#MINIO_ROOT_PASSWORD} >= 8)) || die "minio: MINIO_ROOT_PASSWORD must be at least 8 characters"
    mkdir -p "$MINIO_DATA" "$RUN_DIR"
    log "minio: starting on 127.0.0.1:$MINIO_PORT (data $MINIO_DATA)"
    (
        cd "$MINIO_DIR" || exit 1
        export MINIO_ROOT_USER MINIO_ROOT_PASSWORD MINIO_BROWSER="${MINIO_BROWSER:-off}" MINIO_UPDATE=off
        launch "$MINIO_PID_FILE" "$MINIO_LOG" "$MINIO_BIN" server "$MINIO_DATA" \
            --address "127.0.0.1:$MINIO_PORT" --console-address "127.0.0.1:$MINIO_CONSOLE_PORT"
    )
    wait_minio
}

status_minio() {
    status_line minio "$MINIO_PID_FILE" "$MINIO_PATTERN" minio_live "http://127.0.0.1:$MINIO_PORT" \
        "not answering on port $MINIO_PORT yet"
}

stop_minio() { stop_pid minio "$MINIO_PID_FILE" "$MINIO_PATTERN"; }
