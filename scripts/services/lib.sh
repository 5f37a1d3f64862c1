# shellcheck shell=bash disable=SC2034  # variables here are used by the scripts that source this one
# Helpers shared by scripts/services.sh and the per-service scripts beside this file (sourced, not run).
# Each service script defines credentials_<name>, install_<name>, start_<name>, stop_<name> and status_<name>.

HELPERS="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO_ROOT="$(cd "$HELPERS/../.." && pwd)"
SERVICES_DIR="${LAZYHIPPO_SERVICES_DIR:-$REPO_ROOT/.services}"
RUN_DIR="$SERVICES_DIR/run"
TIMEOUT="${LAZYHIPPO_SERVICES_TIMEOUT:-120}"
CREDENTIALS_FILE="$SERVICES_DIR/credentials.env"

log() { printf '[services] %s\n' "$*" >&2; }
die() { printf '[services] ERROR: %s\n' "$*" >&2; exit 1; }
need() { command -v "$1" >/dev/null 2>&1 || die "$2"; }

# --- credentials: the environment wins, then credentials.env, then a default (random for secrets) -----------
stored_credential() { [[ ! -f "$CREDENTIALS_FILE" ]] || sed -n "s/^$1=//p" "$CREDENTIALS_FILE" | tail -n 1; }
random_secret() { head -c 48 /dev/urandom | base64 | tr -dc 'A-Za-z0-9' | head -c 24; }

# credential KEY [DEFAULT]: sets $KEY (reads only; record_credentials writes).
credential() {
    [[ -n "${!1:-}" ]] || printf -v "$1" '%s' "$(stored_credential "$1")"
    [[ -n "${!1}" ]] || printf -v "$1" '%s' "${2:-}"
}

# secret KEY DATA_MARKER MESSAGE: like credential with a random default, but a data directory (DATA_MARKER
# exists) initialized with a secret we no longer know is refused: a new random one could not match it.
secret() {
    credential "$1"
    [[ -n "${!1}" || ! -e "$2" ]] || die "$3"
    [[ -n "${!1}" ]] || printf -v "$1" '%s' "$(random_secret)"
}

# record_credentials KEY...: appends each KEY=$KEY not yet in the file (mode 600; values are never printed).
record_credentials() {
    local key new=0
    for key; do
        grep -q "^$key=" "$CREDENTIALS_FILE" 2>/dev/null && continue
        (umask 077 && printf '%s=%s\n' "$key" "${!key}" >>"$CREDENTIALS_FILE")
        new=1
    done
    ((new == 0)) || { chmod 600 "$CREDENTIALS_FILE" && log "credentials recorded in $CREDENTIALS_FILE (mode 600)"; }
}

# --- processes ---------------------------------------------------------------------------------------------
# pid_alive PIDFILE PATTERN: prints the pid if it is alive and its command line contains PATTERN (pid reuse).
pid_alive() {
    local pid cmdline
    [[ -f "$1" ]] || return 1
    pid="$(tr -dc '0-9' <"$1")"
    [[ -n "$pid" ]] && kill -0 "$pid" 2>/dev/null || return 1
    cmdline="$(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null)" || return 1
    [[ "$cmdline" == *"$2"* ]] || return 1
    printf '%s' "$pid"
}

port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# launch PIDFILE LOGFILE CMD...: detached from this shell (setsid), stdin closed.
launch() {
    local pidfile="$1" logfile="$2"
    shift 2
    mkdir -p "$(dirname "$pidfile")" "$(dirname "$logfile")"
    rm -f "$pidfile"
    printf '\n==== %s start ====\n' "$(date -u +%FT%TZ)" >>"$logfile"
    # The inner shell writes its own pid, then execs the service (same pid).
    # shellcheck disable=SC2016
    setsid nohup bash -c 'echo $$ >"$0"; exec "$@"' "$pidfile" "$@" >>"$logfile" 2>&1 </dev/null &
    for _ in $(seq 1 50); do
        [[ -s "$pidfile" ]] && return 0
        sleep 0.1
    done
    die "failed to launch $1 (no pid file written)"
}

# stop_pid NAME PIDFILE PATTERN [SIGNAL]: SIGNAL (default TERM), then SIGKILL after 60 s.
stop_pid() {
    local name="$1" file="$2" pattern="$3" sig="${4:-TERM}" pid
    if ! pid="$(pid_alive "$file" "$pattern")"; then
        rm -f "$file"
        log "$name: not running"
        return 0
    fi
    log "$name: stopping (pid $pid)"
    kill -"$sig" "$pid" 2>/dev/null || true
    for _ in $(seq 1 120); do
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.5
    done
    if kill -0 "$pid" 2>/dev/null; then
        log "$name: did not stop within 60 s, sending SIGKILL"
        kill -KILL "$pid" 2>/dev/null || true
        sleep 1
    fi
    rm -f "$file"
    log "$name: stopped"
}

show_log_tail() {
    local f
    for f in "$@"; do
        [[ -f "$f" ]] || continue
        printf '%s\n' "----- last 40 lines of $f -----" >&2
        tail -n 40 "$f" >&2 || true
    done
    printf '%s\n' "-----" >&2
}

# wait_ready NAME PIDFILE PATTERN LOG READY_FN WHERE: polls READY_FN until it succeeds; dies with the log tail
# when the process exits or TIMEOUT passes.
wait_ready() {
    local name=$1 pid_file=$2 pattern=$3 logfile=$4 ready=$5 where=$6 deadline=$((SECONDS + TIMEOUT)) why
    while :; do
        if ! pid_alive "$pid_file" "$pattern" >/dev/null && ! { sleep 1; pid_alive "$pid_file" "$pattern" >/dev/null; }; then
            # looked at twice: while the launcher execs the service, its command line can read empty
            why="process exited during startup"
        elif "$ready"; then
            log "$name: ready ($where)"
            return 0
        elif ((SECONDS >= deadline)); then
            why="not ready after ${TIMEOUT}s"
        else
            sleep 1
            continue
        fi
        log "$name: $why"
        show_log_tail "$logfile"
        die "$name did not become ready (log: $logfile)"
    done
}

# port_taken NAME PORT PORT_VAR PROBE_FN [NOTE]: false if the port is free; true (with a warning) if another
# server that passes PROBE_FN already serves it, e.g. the same service from another checkout; else dies.
port_taken() {
    port_open "$2" || return 1
    "$4" >/dev/null || die "$1: port 127.0.0.1:$2 is already in use by another process (set $3, or stop it)"
    log "$1: WARNING: 127.0.0.1:$2 is already served by a $1 not started from $SERVICES_DIR; using it${5:-}"
}

# status_line NAME PIDFILE PATTERN READY_FN WHERE NOT_YET: prints up/starting/down; true only when up.
status_line() {
    local pid
    if pid="$(pid_alive "$2" "$3")"; then
        if "$4"; then echo "$1: up (pid $pid, $5)"; return 0; fi
        echo "$1: starting (pid $pid, $6)"
        return 1
    fi
    if "$4"; then echo "$1: up ($5, external: not started from $SERVICES_DIR)"; return 0; fi
    echo "$1: down"
    return 1
}

# apt_install NAME PKG...: Debian packages (needs root); the package index is refreshed once per run.
APT_UPDATED=0
apt_install() {
    local name="$1" logf="$SERVICES_DIR/$1-install.log"
    shift
    ((EUID == 0)) || die "$name: needs Debian's $*: run as root, or apt-get install $* first"
    log "$name: apt-get install $*"
    if ! { { ((APT_UPDATED)) || apt-get update -q; } &&
        DEBIAN_FRONTEND=noninteractive apt-get install -y -q "$@"; } >"$logf" 2>&1; then
        show_log_tail "$logf"
        die "$name: apt-get install failed (full log: $logf)"
    fi
    APT_UPDATED=1
}

# already_running NAME PIDFILE PATTERN WAITFN: true (after waiting until it answers) when NAME runs already
already_running() {
    pid_alive "$2" "$3" >/dev/null || return 1
    log "$1: already running (pid $(cat "$2"))"
    "$4"
}
