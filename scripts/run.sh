#!/usr/bin/env bash
# README's run command: installs the Debian 12 dependencies, configures and builds the release preset's
# examples and tool, then runs the main job (scripts/main-job.sh [MODEL_DIR]). Set BUILD_ROOT to build elsewhere.
set -euo pipefail
# shellcheck source=scripts/common.sh
source "$(dirname "$0")/common.sh"
cd "$HYMIX_ROOT"

stage "dependencies"
scripts/install-deps.sh

stage "configure + build (release preset: examples)"
preset_configure release
preset_build release --target hymix_examples

stage "main job"
exec scripts/main-job.sh "$(preset_dir release)" "$@"
