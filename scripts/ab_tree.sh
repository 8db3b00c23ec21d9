#!/usr/bin/env bash
# Extract revision REV's sources to ab-tree/src (ignored by git: the device call carries it
# by name), for gpu_stages.sh's tree-ab stage: the same scenario on REV's build and on the
# working tree's, interleaved on one machine.
#   scripts/ab_tree.sh 5056a6b && run(command="STAGES=tree-ab scripts/gpu_stages.sh", carry=[".whl", "ab-tree"])
set -euo pipefail
rev="${1:?usage: scripts/ab_tree.sh REV}"
cd "$(dirname "$0")/.."
git rev-parse --verify --quiet "$rev^{commit}" >/dev/null || { echo "ab_tree.sh: no revision '$rev'" >&2; exit 2; }
rm -rf ab-tree && mkdir ab-tree
git archive "$rev" src | tar -x -C ab-tree
echo "ab-tree/src: $(git rev-parse --short "$rev")'s sources ($(du -sh ab-tree | cut -f1)); carry \"ab-tree\" with the call"
