#!/usr/bin/env bash
# System packages the cluster test bed (tests/cluster) needs: sshd, rsync, iproute2, ping per namespaced node;
# docker.io + debootstrap for the Docker runtime there. Idempotent: installs only what is missing, and only as
# root (elsewhere it says what is missing and the cluster tests skip with that reason).
#   scripts/testbed-deps.sh            base packages
#   TESTBED_DOCKER=1 scripts/testbed-deps.sh   also docker.io and debootstrap
set -euo pipefail

wanted=(openssh-server openssh-client rsync iproute2 iputils-ping)
if [ "${TESTBED_DOCKER:-0}" = "1" ]; then
    wanted+=(docker.io debootstrap)
fi

missing=()
for pkg in "${wanted[@]}"; do
    if ! dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed"; then
        missing+=("$pkg")
    fi
done

if [ "${#missing[@]}" -eq 0 ]; then
    echo "[testbed-deps] already installed: ${wanted[*]}"
    exit 0
fi
if [ "$(id -u)" != "0" ] || ! command -v apt-get >/dev/null 2>&1; then
    echo "[testbed-deps] missing ${missing[*]}; not root or no apt-get here, so the cluster tests will skip" >&2
    exit 0
fi
echo "[testbed-deps] installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "[testbed-deps] done"
