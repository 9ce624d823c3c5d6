#!/usr/bin/env bash
# README's run command: installs the Debian 12 dependencies, configures and builds the release preset's
# examples and tool, then runs the main job (scripts/main-job.sh [MODEL_DIR]). Set BUILD_ROOT to build elsewhere.
set -euo pipefail
# shellcheck source=scripts/common.sh
source "$(dirname "$0")/common.sh"
# A model directory given as an argument or in $HYMIX_MODEL is relative to where run.sh was called from.
model_args=()
for a in "$@"; do case $a in /*) model_args+=("$a") ;; *) model_args+=("$PWD/$a") ;; esac; done
if [ -n "${HYMIX_MODEL:-}" ]; then case $HYMIX_MODEL in /*) ;; *) export HYMIX_MODEL="$PWD/$HYMIX_MODEL" ;; esac; fi
cd "$HYMIX_ROOT"

stage "dependencies"
scripts/install-deps.sh

stage "configure + build (release preset: examples)"
preset_configure release
preset_build release --target hymix_examples

stage "main job"
exec scripts/main-job.sh "$(preset_dir release)" "${model_args[@]}"
