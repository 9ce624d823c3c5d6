# Shared set-up of the AMOR experiment scripts (amor_experiments.sh, amor_router.sh; sourced, not run): the shared
# folder, the text, the tool and the backbones from the environment (SHARED, HYMIX, BACKBONES), each checked, with the
# calling script's name in the messages.
# shellcheck shell=bash
amor_script=${amor_script:-$(basename "$0" .sh)}
shared=${SHARED:-../shared}
text=$shared/data/kjv.txt
tool=${HYMIX:-build/release/examples/tool/hymix}
backbones=${BACKBONES:-kjv-mamba2-byte kjv-gdn-byte}
[ -x "$tool" ] || { echo "$amor_script: build the tool first (cmake --preset release && cmake --build --preset release --target hymix_tool)" >&2; exit 2; }
[ -f "$text" ] || { echo "$amor_script: no text '$text' (set SHARED to the folder holding data/kjv.txt and models/)" >&2; exit 2; }
for bb in $backbones; do
    [ -d "$shared/models/$bb" ] || { echo "$amor_script: no backbone '$shared/models/$bb'" >&2; exit 2; }
done
