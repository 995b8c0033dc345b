#!/usr/bin/env bash
# Installs the Debian packages the local control plane needs, skipping what is present.
set -euo pipefail
need=()
command -v prometheus >/dev/null 2>&1 || need+=(prometheus)
command -v openssl >/dev/null 2>&1 || need+=(openssl)
# The image builds (images/build.sh) and their run test: Debian's own tools, no Docker. runc,
# not only podman's default crun, because crun refuses hosts with hybrid cgroups.
command -v mmdebstrap >/dev/null 2>&1 || need+=(mmdebstrap)
command -v podman >/dev/null 2>&1 || need+=(podman)
command -v runc >/dev/null 2>&1 || need+=(runc)
if ((${#need[@]})); then
  echo "install-system-packages: installing ${need[*]}"
  export DEBIAN_FRONTEND=noninteractive
  sudo_cmd=""
  [[ $(id -u) -eq 0 ]] || sudo_cmd="sudo"
  $sudo_cmd apt-get update -qq
  $sudo_cmd apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
