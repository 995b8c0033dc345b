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
if [[ "$want" == all || "$want" == keda ]]; then
  # KEDA's own ScaledObject CRD, from its Go module (fetched like the Kubernetes sources), so
  # the external-mode e2e proves the API server accepts what the operator renders.
  keda_version="$(cat "$here/keda.version")"
  dir="$cache/crds/keda-$keda_version"
  if [[ ! -f "$dir/.complete" ]]; then
    echo "build-binaries: fetching KEDA $keda_version's CRDs"
    src="$(cd "$cache" && GOFLAGS=-mod=mod GO111MODULE=on go mod download -json \
      "github.com/kedacore/keda/v2@$keda_version" | sed -n 's/^\s*"Dir": "\(.*\)",$/\1/p')"
    if [[ -z "$src" || ! -f "$src/config/crd/bases/keda.sh_scaledobjects.yaml" ]]; then
      echo "build-binaries: KEDA $keda_version's module has no ScaledObject CRD" >&2
      exit 1
    fi
    mkdir -p "$dir"
    cp "$src/config/crd/bases/keda.sh_scaledobjects.yaml" "$dir/"
    touch "$dir/.complete"
  fi
  ln -sfn "$dir" "$cache/crds/keda"
  echo "build-binaries: KEDA's CRDs are in $dir"
fi
if [[ "$want" == all || "$want" == gateway-api ]]; then
  # The Gateway API's standard-channel CRDs (HTTPRoute, Gateway, GatewayClass), from its Go
  # module, so the e2e proves the API server accepts the route a spec.gateway renders.
  gateway_version="$(cat "$here/gateway-api.version")"
  dir="$cache/crds/gateway-api-$gateway_version"
  if [[ ! -f "$dir/.complete" ]]; then
    echo "build-binaries: fetching the Gateway API $gateway_version's CRDs"
    src="$(cd "$cache" && GOFLAGS=-mod=mod GO111MODULE=on go mod download -json \
      "sigs.k8s.io/gateway-api@$gateway_version" | sed -n 's/^\s*"Dir": "\(.*\)",$/\1/p')"
    crds="$src/config/crd/standard"
    if [[ -z "$src" || ! -f "$crds/gateway.networking.k8s.io_httproutes.yaml" ]]; then
      echo "build-binaries: the Gateway API $gateway_version's module has no HTTPRoute CRD" >&2
      exit 1
    fi
    mkdir -p "$dir"
    for kind in httproutes gateways gatewayclasses; do
      cp "$crds/gateway.networking.k8s.io_$kind.yaml" "$dir/"
    done
    touch "$dir/.complete"
  fi
  ln -sfn "$dir" "$cache/crds/gateway-api"
  echo "build-binaries: the Gateway API's CRDs are in $dir"
fi
if [[ "$want" == all || "$want" == inference-extension ]]; then
  # The Gateway API Inference Extension's CRDs (InferencePool v1, InferenceObjective), from its
  # Go module at the version llm-d-inference-scheduler v0.4.0 builds on, so the e2e proves the
  # API server accepts what router.kind inferencePool renders.
  gie_version="$(cat "$here/inference-extension.version")"
  dir="$cache/crds/inference-extension-$gie_version"
  if [[ ! -f "$dir/.complete" ]]; then
    echo "build-binaries: fetching the Inference Extension $gie_version's CRDs"
    src="$(cd "$cache" && GOFLAGS=-mod=mod GO111MODULE=on go mod download -json \
      "sigs.k8s.io/gateway-api-inference-extension@$gie_version" \
      | sed -n 's/^\s*"Dir": "\(.*\)",$/\1/p')"
    crds="$src/config/crd/bases"
    if [[ -z "$src" || ! -f "$crds/inference.networking.k8s.io_inferencepools.yaml" ]]; then
      echo "build-binaries: the Inference Extension $gie_version's module has no InferencePool CRD" >&2
      exit 1
    fi
    mkdir -p "$dir"
    cp "$crds/inference.networking.k8s.io_inferencepools.yaml" \
      "$crds/inference.networking.x-k8s.io_inferenceobjectives.yaml" "$dir/"
    touch "$dir/.complete"
  fi
  ln -sfn "$dir" "$cache/crds/inference-extension"
  echo "build-binaries: the Inference Extension's CRDs are in $dir"
fi
if [[ "$want" == all || "$want" == prometheus-operator ]]; then
  # The Prometheus Operator's CRDs (PrometheusRule, ServiceMonitor, PodMonitor), from its Go
  # module, so the e2e proves the API server accepts the chart's monitoring objects.
  po_version="$(cat "$here/prometheus-operator.version")"
  dir="$cache/crds/prometheus-operator-$po_version"
  if [[ ! -f "$dir/.complete" ]]; then
    echo "build-binaries: fetching the Prometheus Operator $po_version's CRDs"
    src="$(cd "$cache" && GOFLAGS=-mod=mod GO111MODULE=on go mod download -json \
      "github.com/prometheus-operator/prometheus-operator@$po_version" | sed -n 's/^\s*"Dir": "\(.*\)",$/\1/p')"
    crds="$src/example/prometheus-operator-crd"
    if [[ -z "$src" || ! -f "$crds/monitoring.coreos.com_prometheusrules.yaml" ]]; then
      echo "build-binaries: the Prometheus Operator $po_version's module has no CRDs" >&2
      exit 1
    fi
    mkdir -p "$dir"
    for kind in prometheusrules servicemonitors podmonitors; do
      cp "$crds/monitoring.coreos.com_$kind.yaml" "$dir/"
    done
    touch "$dir/.complete"
  fi
  ln -sfn "$dir" "$cache/crds/prometheus-operator"
  echo "build-binaries: the Prometheus Operator's CRDs are in $dir"
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
