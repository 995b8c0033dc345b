#!/usr/bin/env bash
# Builds the operator and router images without Docker: a minimal Debian root made with
# Debian's own mmdebstrap, the locked wheels installed inside it, then imported with podman
# and saved as an OCI archive, with the package lists beside it (an SBOM-style inventory).
#
#   images/build.sh operator router engine-standin     (make images)
#
# Output, cached per hash of everything that goes in:
#   $DISAGG_CACHE/images/<image>-<key>/{<image>.oci.tar,packages-debian.txt,packages-python.txt}
#   $DISAGG_CACHE/images/<image> -> that directory
# and the image localhost/disagg-<image>:<version> in podman's local store.
#
# engine-standin checks images/engine/Dockerfile, whose vLLM and SGLang base images cannot be
# pulled here: both targets are built with `podman build` on a stand-in base (Debian's
# python3 and pip, as the upstream images have them), giving localhost/disagg-engine-<target>:
# <version>-standin-<key>, their tags in its cache directory.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cache="${DISAGG_CACHE:-$HOME/.cache/disagg}"
python="${PYTHON:-$root/.venv/bin/python}"
suite="${DEBIAN_SUITE:-bookworm}"
mirror="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
version="$(sed -n 's/^version = "\(.*\)"/\1/p' "$root/pyproject.toml" | head -n1)"

for tool in mmdebstrap podman; do
  if ! command -v "$tool" >/dev/null 2>&1; then
    echo "images: $tool is missing (make system-packages installs it)" >&2
    exit 2
  fi
done

inputs_key() {
  local image="$1"
  (
    cd "$root"
    find operator/disagg engine/src -type f -name '*.py' -o -type f -name '*.yaml' -o -type f -name py.typed
    echo pyproject.toml engine/pyproject.toml README.md "images/$image.lock" images/build.sh
  ) | tr ' ' '\n' | sort | (cd "$root" && xargs sha256sum) | { cat; echo "$suite $mirror"; } \
    | sha256sum | cut -c1-12
}

entrypoint_of() {
  case "$1" in
    operator) echo '["disagg"]|["run"]' ;;
    router) echo '["disagg-router"]|[]' ;;
    *) echo "images: unknown image $1 (operator, router or engine-standin)" >&2; exit 2 ;;
  esac
}

# A Debian root as a tar: the Essential set, Python, pip and CA certificates, without docs,
# man pages, locales or apt's caches; the extra arguments are mmdebstrap hooks that run first.
debian_root() {
  local dir="$1" out="$2"
  shift 2
  mmdebstrap --quiet --variant=essential --include=python3,python3-pip,ca-certificates \
    --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-exclude=/usr/share/man/*' \
    --dpkgopt='path-exclude=/usr/share/locale/*' "$@" \
    --customize-hook='rm -rf "$1/var/cache/apt" "$1/var/lib/apt/lists"' \
    --format=tar "$suite" "$out" "$mirror" >"$dir/mmdebstrap.log" 2>&1 || {
    echo "images: mmdebstrap failed; the last lines of $dir/mmdebstrap.log:" >&2
    tail -n 20 "$dir/mmdebstrap.log" >&2
    exit 1
  }
}

build() {
  local image="$1" key dir work entry cmd
  entry="$(entrypoint_of "$image")"
  cmd="${entry#*|}"
  entry="${entry%|*}"
  key="$(inputs_key "$image")"
  dir="$cache/images/$image-$key"
  if [[ -f "$dir/.complete" ]] && podman image exists "localhost/disagg-$image:$version-$key"; then
    ln -sfn "$dir" "$cache/images/$image"
    echo "images: $image is cached in $dir"
    return 0
  fi
  echo "images: building $image ($suite from $mirror; a few minutes)"
  rm -rf "$dir"
  mkdir -p "$dir"
  work="$(mktemp -d)"
  trap 'rm -rf "$work"' RETURN
  # The locked dependencies as wheels (built from sdists where a package has no wheel), and
  # the project's own two distributions, built offline.
  "$python" -m pip wheel --quiet --no-deps --only-binary=:none: -r "$root/images/$image.lock" \
    -w "$work/wheels" 2>"$dir/wheels.log" || {
    echo "images: fetching the locked wheels failed; see $dir/wheels.log" >&2
    exit 1
  }
  # The router imports nothing of the engine launcher, so its image leaves it out.
  local own=("$root")
  [[ "$image" == router ]] || own=("$root/engine" "$root")
  "$python" -m pip wheel --quiet --no-deps --no-build-isolation "${own[@]}" \
    -w "$work/wheels" 2>>"$dir/wheels.log"
  # A Debian base with only the Essential set, Python and CA certificates; docs and man pages
  # left out. pip runs inside the new root (Debian's pip installs into /usr/local), so the
  # console scripts point at its python3.
  debian_root "$dir" "$work/rootfs.tar" \
    --customize-hook='mkdir -p "$1/tmp/wheels"' --customize-hook="sync-in '$work/wheels' /tmp/wheels" \
    --customize-hook='chroot "$1" sh -c "python3 -m pip install --quiet --no-index --no-deps --no-cache-dir --break-system-packages /tmp/wheels/*.whl"' \
    --customize-hook='chroot "$1" python3 -m pip uninstall --quiet --yes --break-system-packages pip' \
    --customize-hook='rm -rf "$1/tmp/wheels"' \
    --customize-hook="chroot \"\$1\" dpkg-query -W -f='\${Package} \${Version}\n' > '$dir/packages-debian.txt'" \
    --customize-hook="ls \"\$1/usr/local/lib\"/python3*/dist-packages | sed -n 's/^\(.*\)-\([^-]*\)\.dist-info\$/\1 \2/p' > '$dir/packages-python.txt'"
  local tag="localhost/disagg-$image:$version-$key"
  podman import --quiet \
    --change 'USER 65532:65532' --change 'WORKDIR /tmp' \
    --change 'ENV HOME=/tmp PYTHONUNBUFFERED=1' \
    --change "ENTRYPOINT $entry" --change "CMD $cmd" \
    --change "LABEL org.opencontainers.image.title=disagg-$image org.opencontainers.image.version=$version" \
    "$work/rootfs.tar" "$tag" >/dev/null
  podman tag "$tag" "localhost/disagg-$image:$version"
  podman save --quiet --format oci-archive -o "$dir/$image.oci.tar" "$tag"
  echo "$tag" >"$dir/tag"
  touch "$dir/.complete"
  ln -sfn "$dir" "$cache/images/$image"
  # Earlier builds of this image go: their archives and their entries in podman's store.
  for old in "$cache/images/$image"-*; do
    [[ "$old" == "$dir" || ! -d "$old" ]] && continue
    [[ -f "$old/tag" ]] && podman rmi --force "$(cat "$old/tag")" >/dev/null 2>&1 || true
    rm -rf "$old"
  done
  echo "images: $image built: $tag, $dir/$image.oci.tar ($(du -h "$dir/$image.oci.tar" | cut -f1))"
}

# The engine Dockerfile's targets, each on the stand-in base in place of its upstream image.
build_engine_standin() {
  local key dir work base target tag runtime=()
  command -v runc >/dev/null 2>&1 && runtime=(--runtime runc)
  key="$(
    cd "$root"
    { find engine -type f ! -path '*/__pycache__/*' ! -path '*.egg-info/*'; echo images/engine/Dockerfile images/build.sh; } \
      | tr ' ' '\n' | sort | xargs sha256sum | { cat; echo "$suite $mirror"; } | sha256sum | cut -c1-12
  )"
  dir="$cache/images/engine-standin-$key"
  base="localhost/disagg-engine-base:standin-$key"
  if [[ -f "$dir/.complete" ]] && podman image exists "$(head -n1 "$dir/tag-vllm")"; then
    ln -sfn "$dir" "$cache/images/engine-standin"
    echo "images: engine-standin is cached in $dir"
    return 0
  fi
  echo "images: building the engine Dockerfile's targets on a stand-in base (under a minute)"
  rm -rf "$dir"
  mkdir -p "$dir"
  work="$(mktemp -d)"
  trap 'rm -rf "$work"' RETURN
  # What the Dockerfile needs of its base: python3 with a pip that may install as root (the
  # upstream images are not PEP 668 "externally managed"), and a trust store that reaches the
  # package index from this machine (its egress re-signs TLS), since pip fetches the
  # launcher's build backend.
  debian_root "$dir" "$work/rootfs.tar" \
    --customize-hook='rm -f "$1"/usr/lib/python3*/EXTERNALLY-MANAGED' \
    --customize-hook='upload /etc/ssl/certs/ca-certificates.crt /etc/ssl/certs/ca-certificates.crt'
  podman import --quiet --change 'CMD ["python3"]' "$work/rootfs.tar" "$base" >/dev/null
  echo "$base" >"$dir/tag-base"
  for target in vllm sglang; do
    tag="localhost/disagg-engine-$target:$version-standin-$key"
    # RUN steps need a runtime: runc where present (crun refuses hybrid cgroups), and no
    # default ulimits (images/containers.conf).
    (cd "$root" && CONTAINERS_CONF="${CONTAINERS_CONF:-$root/images/containers.conf}" \
      podman build ${runtime[@]+"${runtime[@]}"} --quiet --network host --pull=never \
      --build-arg VLLM_IMAGE="$base" --build-arg SGLANG_IMAGE="$base" --build-arg VERSION="$version" \
      --target "$target" -f images/engine/Dockerfile -t "$tag" .) >"$dir/build-$target.log" 2>&1 || {
      echo "images: podman build of the engine's $target target failed; the last lines of $dir/build-$target.log:" >&2
      tail -n 20 "$dir/build-$target.log" >&2
      exit 1
    }
    echo "$tag" >"$dir/tag-$target"
  done
  touch "$dir/.complete"
  ln -sfn "$dir" "$cache/images/engine-standin"
  for old in "$cache/images/engine-standin"-*; do
    [[ "$old" == "$dir" || ! -d "$old" ]] && continue
    for file in "$old"/tag-*; do
      [[ -f "$file" ]] && podman rmi --force "$(cat "$file")" >/dev/null 2>&1 || true
    done
    rm -rf "$old"
  done
  echo "images: engine-standin built: $(cat "$dir/tag-vllm"), $(cat "$dir/tag-sglang")"
}

mkdir -p "$cache/images"
for image in "${@:-operator router engine-standin}"; do
  for one in $image; do
    if [[ "$one" == engine-standin ]]; then build_engine_standin; else build "$one"; fi
  done
done
