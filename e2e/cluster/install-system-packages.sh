#!/usr/bin/env bash
# Installs the Debian packages the local control plane needs, skipping what is present.
set -euo pipefail
need=()
command -v prometheus >/dev/null 2>&1 || need+=(prometheus)
command -v openssl >/dev/null 2>&1 || need+=(openssl)
if ((${#need[@]})); then
  echo "install-system-packages: installing ${need[*]}"
  export DEBIAN_FRONTEND=noninteractive
  sudo_cmd=""
  [[ $(id -u) -eq 0 ]] || sudo_cmd="sudo"
  $sudo_cmd apt-get update -qq
  $sudo_cmd apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
