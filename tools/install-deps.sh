#!/bin/sh
# Installs the Debian 12 packages quest builds with, when any is missing (apt-get; sudo when not root).
set -eu
PKGS="build-essential cmake ninja-build pkg-config libsentencepiece-dev nlohmann-json3-dev libspdlog-dev libcli11-dev libgtest-dev libpcre2-dev libgmock-dev clang libclang-rt-14-dev"
missing=""
for p in $PKGS; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
[ -z "$missing" ] && exit 0
SUDO=""
[ "$(id -u)" = 0 ] || SUDO=sudo
echo "installing:$missing" >&2
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends $missing
