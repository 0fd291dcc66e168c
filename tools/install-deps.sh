#!/usr/bin/env bash
# Installs every build, test and run dependency of wmserve from Debian 12's
# packages. Idempotent: packages already present are left alone. Used by the
# README, .ci/run and the Dockerfile.
set -euo pipefail

pkgs=(
  build-essential cmake pkg-config git ca-certificates
  libgrpc++-dev libprotobuf-dev protobuf-compiler protobuf-compiler-grpc
  libabsl-dev libjpeg62-turbo-dev prometheus-cpp-dev libcivetweb-dev nlohmann-json3-dev
  libopenblas-dev libopenblas0-openmp libeigen3-dev libgtest-dev libgmock-dev libbenchmark-dev libssl-dev
  python3 python3-numpy python3-grpcio
  openssl
)

missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#pkgs[@]} packages present"
  exit 0
fi
echo "install-deps: installing ${missing[*]}"
SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO=sudo
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
