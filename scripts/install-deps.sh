#!/usr/bin/env bash
# Installs hymix's build and test dependencies from Debian 12 (bookworm) packages. Idempotent: packages
# already installed are left alone, and `apt-get update` runs only when something is missing.
# Uses sudo only when not running as root.
set -euo pipefail

packages=(
    build-essential cmake ninja-build             # compiler and build tools
    clang libclang-rt-14-dev                      # clang + its libFuzzer/sanitizer runtimes (sanitize preset, fuzzers)
    libeigen3-dev                                 # GEMM and matrix maps
    libxsimd-dev xtl-dev                          # SIMD kernels; Debian's xsimd CMake target links `xtl` by name
    libtbb-dev                                    # oneTBB: threads of the CPU backend
    nlohmann-json3-dev                            # config.json and safetensors headers
    doctest-dev libbenchmark-dev                  # tests and benchmarks
    libcli11-dev libfmt-dev                       # the command-line tool
    bible-kjv                                     # text corpus used by the examples and tests
)

missing=()
for p in "${packages[@]}"; do
    if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
        missing+=("$p")
    fi
done

if [ ${#missing[@]} -eq 0 ]; then
    echo "install-deps: all ${#packages[@]} packages already installed"
    exit 0
fi

if [ "$(id -u)" -eq 0 ]; then
    sudo=()
else
    if ! command -v sudo >/dev/null 2>&1; then
        echo "install-deps: missing packages (${missing[*]}) and not root, but sudo is not available" >&2
        exit 1
    fi
    sudo=(sudo)
fi

echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
"${sudo[@]}" apt-get update
"${sudo[@]}" apt-get install -y "${missing[@]}"
