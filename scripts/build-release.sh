#!/usr/bin/env bash
# Builds the `comb` binary of an earlier release, once, for the upgrade test:
#   scripts/build-release.sh v0.1.0   →   target/releases/v0.1.0/comb
# Without an argument, the newest release listed in releases.txt (the one before this).
# The release's commit comes from its tag, or from releases.txt in a clone without tags. Its
# source is exported with `git archive` (no checkout is touched) and built with a target
# directory of its own under target/releases, so the current build's binaries stay as they
# are. A build already there is kept.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

release="${1:-$(awk '/^v/ { r = $1 } END { print r }' releases.txt)}"
out="target/releases/$release"
if [[ -x "$out/comb" ]]; then
    exit 0
fi

commit="$(git rev-parse -q --verify "refs/tags/$release^{commit}" 2>/dev/null || true)"
if [[ -z "$commit" ]]; then
    commit="$(awk -v r="$release" '$1 == r { print $2 }' releases.txt)"
fi
if [[ -z "$commit" ]]; then
    echo "build-release: $release is neither a tag nor listed in releases.txt" >&2
    exit 1
fi
if ! git cat-file -e "$commit^{commit}" 2>/dev/null; then
    echo "build-release: commit $commit of $release is not in this clone's history;" \
        "fetch it (git fetch --unshallow, or git fetch origin tag $release)" >&2
    exit 1
fi

echo "build-release: building comb $release ($commit) into $out"
rm -rf "$out/src"
mkdir -p "$out/src"
git archive "$commit" | tar -x -C "$out/src"
CARGO_TARGET_DIR="$PWD/target/releases/target" \
    cargo build --locked --manifest-path "$out/src/Cargo.toml" -p comb-cli
cp "target/releases/target/debug/comb" "$out/comb.tmp"
mv "$out/comb.tmp" "$out/comb"
echo "build-release: $out/comb"
