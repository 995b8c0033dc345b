#!/usr/bin/env bash
# Builds the real control-plane binaries from the Go module proxy into a per-pin cache.
#
# The cache key is a hash of the wrapper go.mod/go.sum files and the link flags, so a binary
# is rebuilt only when its pin or the version stamped into it changes. Output: $DISAGG_CACHE/bin/<set>-<hash>/ plus a stable symlink
# $DISAGG_CACHE/bin/<set> -> that directory. Nothing built here is ever committed.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cache="${DISAGG_CACHE:-$HOME/.cache/disagg}"
mkdir -p "$cache/bin" "$cache/logs"

if ! command -v go >/dev/null 2>&1; then
  echo "build-binaries: the Go toolchain is missing (need Go >= 1.26 on PATH)" >&2
  exit 2
fi

key_of() { { cat "$here/$1/go.mod" "$here/$1/go.sum"; echo "$2"; } | sha256sum | cut -c1-12; }

build_set() {
  local set="$1" ldflags="$2"; shift 2
  local key dir log
  key="$(key_of "$set" "$ldflags")"
  dir="$cache/bin/$set-$key"
  log="$cache/logs/build-$set.log"
  if [[ -f "$dir/.complete" ]]; then
    ln -sfn "$dir" "$cache/bin/$set"
    echo "build-binaries: $set is cached in $dir"
    return 0
  fi
  echo "build-binaries: building $set (cold builds take many minutes; log: $log)"
  mkdir -p "$dir"
  if ! ( cd "$here/$set" && CGO_ENABLED=0 GOTOOLCHAIN=local GOFLAGS=-mod=mod \
      go build -trimpath -ldflags "$ldflags" -o "$dir/" "$@" ) >"$log" 2>&1; then
    echo "build-binaries: building $set FAILED; the last lines of $log:" >&2
    tail -n 20 "$log" >&2
    exit 1
  fi
  if [[ -n "${RENAME_FROM:-}" ]]; then mv "$dir/$RENAME_FROM" "$dir/$RENAME_TO"; fi
  touch "$dir/.complete"
  ln -sfn "$dir" "$cache/bin/$set"
  echo "build-binaries: $set built into $dir"
}

k8s_version="$(sed -n 's/^\s*k8s.io\/kubernetes \(v[0-9.]*\).*/\1/p' "$here/k8s/go.mod" | head -n1)"
k8s_minor="$(echo "$k8s_version" | cut -d. -f2)"
version_flags=""
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  version_flags+=" -X $pkg.gitVersion=$k8s_version -X $pkg.gitMajor=1 -X $pkg.gitMinor=$k8s_minor"
  version_flags+=" -X $pkg.gitTreeState=clean"
done

want="${1:-all}"
if [[ "$want" == all || "$want" == kwok ]]; then
  build_set kwok "-s -w" sigs.k8s.io/kwok/cmd/kwok
fi
if [[ "$want" == all || "$want" == etcd ]]; then
  # Debian's etcd 3.4.23 lacks RequestWatchProgress, which client-go >= 1.35 watch lists need.
  RENAME_FROM=server RENAME_TO=etcd build_set etcd "-s -w" go.etcd.io/etcd/server/v3
fi
if [[ "$want" == all || "$want" == k8s ]]; then
  build_set k8s "-s -w $version_flags" \
    k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager \
    k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kubectl
fi
# CRDs of the APIs the operator renders objects of, each from its project's Go module at the
# version pinned in e2e/cluster/<name>.version (fetched like the Kubernetes sources), so the
# e2e proves the API server accepts what the operator renders: fetch_crds NAME LABEL MODULE
# DIRECTORY FILE... (the first FILE must be there).
fetch_crds() {
  local name="$1" label="$2" module="$3" subdir="$4"
  shift 4
  local version dir src
  version="$(cat "$here/$name.version")"
  dir="$cache/crds/$name-$version"
  if [[ ! -f "$dir/.complete" ]]; then
    echo "build-binaries: fetching $label $version's CRDs"
    src="$(cd "$cache" && GOFLAGS=-mod=mod GO111MODULE=on go mod download -json \
      "$module@$version" | sed -n 's/^\s*"Dir": "\(.*\)",$/\1/p')"
    if [[ -z "$src" || ! -f "$src/$subdir/$1" ]]; then
      echo "build-binaries: $label $version's module has no $subdir/$1" >&2
      exit 1
    fi
    mkdir -p "$dir"
    for file in "$@"; do
      cp "$src/$subdir/$file" "$dir/"
    done
    touch "$dir/.complete"
  fi
  ln -sfn "$dir" "$cache/crds/$name"
  echo "build-binaries: $label's CRDs are in $dir"
}
if [[ "$want" == all || "$want" == keda ]]; then
  # KEDA's ScaledObject: spec.autoscaling.mode external.
  fetch_crds keda KEDA github.com/kedacore/keda/v2 config/crd/bases keda.sh_scaledobjects.yaml
fi
if [[ "$want" == all || "$want" == gateway-api ]]; then
  # The Gateway API's standard channel: spec.gateway's HTTPRoute.
  fetch_crds gateway-api "the Gateway API" sigs.k8s.io/gateway-api config/crd/standard \
    gateway.networking.k8s.io_httproutes.yaml gateway.networking.k8s.io_gateways.yaml \
    gateway.networking.k8s.io_gatewayclasses.yaml
fi
if [[ "$want" == all || "$want" == inference-extension ]]; then
  # The Inference Extension at the version llm-d-inference-scheduler v0.4.0 builds on:
  # router.kind inferencePool's InferencePool (and the InferenceObjective its picker watches).
  fetch_crds inference-extension "the Inference Extension" \
    sigs.k8s.io/gateway-api-inference-extension config/crd/bases \
    inference.networking.k8s.io_inferencepools.yaml \
    inference.networking.x-k8s.io_inferenceobjectives.yaml
fi
if [[ "$want" == all || "$want" == prometheus-operator ]]; then
  # PrometheusRule, ServiceMonitor and PodMonitor: the chart's monitoring objects.
  fetch_crds prometheus-operator "the Prometheus Operator" \
    github.com/prometheus-operator/prometheus-operator example/prometheus-operator-crd \
    monitoring.coreos.com_prometheusrules.yaml monitoring.coreos.com_servicemonitors.yaml \
    monitoring.coreos.com_podmonitors.yaml
fi
if [[ "$want" == all || "$want" == helm ]] && [[ -d "$here/helm" ]]; then
  # As Helm's own Makefile does: stamp its version, and the Kubernetes version it renders for
  # without a cluster (.Capabilities.KubeVersion) from the client-go it is built with; left
  # unset, that is v1.20 and a chart with kubeVersion ">=1.29" fails `helm template`.
  helm_version="$(sed -n 's/^\s*helm.sh\/helm\/v3 \(v[0-9.]*\).*/\1/p' "$here/helm/go.mod" | head -n1)"
  client_minor="$(sed -n 's/^\s*k8s.io\/client-go v0\.\([0-9]*\)\..*/\1/p' "$here/helm/go.mod" | head -n1)"
  helm_flags="-s -w -X helm.sh/helm/v3/internal/version.version=$helm_version"
  helm_flags+=" -X helm.sh/helm/v3/internal/version.gitTreeState=clean"
  for pkg in helm.sh/helm/v3/pkg/chartutil helm.sh/helm/v3/pkg/lint/rules; do
    helm_flags+=" -X $pkg.k8sVersionMajor=1 -X $pkg.k8sVersionMinor=$client_minor"
  done
  build_set helm "$helm_flags" helm.sh/helm/v3/cmd/helm
fi
