# Sourced by start.sh, stop.sh, start-tp3.sh and test.sh (never run on its own).
# Makes .venv on first use and installs what pyproject.toml asks for; a stamp file skips all of it until
# pyproject.toml changes. Where no NVIDIA GPU answers, a CPU build of torch is installed first, pinned, so the
# engine extra does not pull a multi-GB CUDA build.

CPU_TORCH="2.13.0"
CPU_TRITON="3.6.0"   # on a CPU machine only for the tests: they run our Triton kernels in its interpreter
VENV="${SPARKS_VENV:-$here/.venv}"

setup_say() { printf '[setup] %s\n' "$*" >&2; }

has_nvidia_gpu() {
    command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU'
}

# bootstrap EXTRAS: make sure .venv has this project installed with the given extras ("engine" or "engine,dev").
bootstrap() {
    local extras="$1" stamp="$VENV/.sparks-setup-${1//,/-}" want
    want="$(sha256sum "$here/pyproject.toml" | cut -d' ' -f1)"
    if [ -x "$VENV/bin/python" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$want" ]; then
        return 0
    fi
    if ! python3 -c 'import sys; sys.exit(sys.version_info < (3, 10))' 2>/dev/null; then
        setup_say "ERROR: python3 (3.10 or newer) is needed to set up $VENV: install it (apt install python3 python3-venv)"
        exit 1
    fi
    setup_say "Setting up $VENV with [$extras] (once; again only when pyproject.toml changes)"
    if [ ! -x "$VENV/bin/python" ]; then
        python3 -m venv "$VENV" || { setup_say "ERROR: python3 -m venv failed (apt install python3-venv)"; exit 1; }
    fi
    if ! has_nvidia_gpu; then
        setup_say "No NVIDIA GPU here: installing the CPU build torch==$CPU_TORCH"
        "$VENV/bin/python" -m pip install -q "torch==$CPU_TORCH"
        if [[ ",$extras," == *",dev,"* ]]; then
            setup_say "and triton==$CPU_TRITON, whose interpreter runs the engine's GPU kernels in the tests"
            "$VENV/bin/python" -m pip install -q "triton==$CPU_TRITON"
        fi
    fi
    local install="$extras"
    if has_nvidia_gpu; then
        install="$extras,gpu"   # fla-core: never on a CPU machine, where transformers would pick its kernels up
    fi
    "$VENV/bin/python" -m pip install -q -e "$here[$install]"
    echo "$want" > "$stamp"
    if [ "$extras" = "engine,dev" ]; then echo "$want" > "$VENV/.sparks-setup-engine"; fi
    setup_say "Done: $VENV is ready"
}
