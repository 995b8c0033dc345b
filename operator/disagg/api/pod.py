"""What a pool's pods get besides the engine: their identity (service account, runtime class,
labels, annotations) and volumes of the user's own, validated as the API server validates a
pod (Kubernetes v1.35.4, ``pkg/apis/core/validation``: ValidateVolumes for the four volume
sources offered here, validateVolumeMounts, ValidateLabels, ValidateAnnotations), and kept
apart from what the operator sets itself (its selector labels, its annotations, its volumes
and their mount paths), so a model this accepts renders pods the API server accepts.
"""

from __future__ import annotations

from typing import Annotated, ClassVar, Final, Literal

from pydantic import Field

from disagg.api.base import ApiModel, Quantity
from disagg.api.rules import Rule
from disagg.api.scheduling import DNS_LABEL, DNS_SUBDOMAIN, LABEL_VALUE, label_keys_rule

_ELEMENT: Final = r"([^/.][^/]*|\.[^/.][^/]*|\.\.[^/]+|\.)"
_DESCENDING: Final = rf"^{_ELEMENT}(/{_ELEMENT}?)*$"
"""A relative path with no '..' element (validateLocalDescendingPath)."""
POD_PATTERN_MEANINGS: Final = {
    _DESCENDING: "must be a relative path with no '..' element",
    r"^/": "must be an absolute path",
}
RESERVED_PREFIXES: Final = ("disagg.dev/", "app.kubernetes.io/", "k8s.v1.cni.cncf.io/")
"""Label and annotation keys the operator sets on pool pods (its selector, its spec hash,
Multus' network annotation): a model may not set them."""
OPERATOR_VOLUMES: Final = ("dshm", "models", "cache")
OPERATOR_MOUNTS: Final = ("/dev/shm", "/models", "/cache")


class LocalReference(ApiModel):
    """An object in the model's namespace, by name."""

    name: str = Field(max_length=253, pattern=DNS_SUBDOMAIN, description="Its name.")


class KeyToPath(ApiModel):
    """One key of a Secret or ConfigMap, as a file."""

    key: str = Field(
        min_length=1, max_length=253, pattern=r"^[-._a-zA-Z0-9]+$", description="The key."
    )
    path: str = Field(
        min_length=1,
        max_length=4096,
        pattern=_DESCENDING,
        description="Relative file path (no '..' element, not absolute).",
    )


class SecretVolume(ApiModel):
    """A Secret's keys as files."""

    secret_name: str = Field(max_length=253, pattern=DNS_SUBDOMAIN, description="The Secret.")
    items: list[KeyToPath] = Field(
        default_factory=list, max_length=64, description="Only these keys (default: all)."
    )
    optional: bool | None = Field(default=None, description="Start even if it is missing.")


class ConfigMapVolume(ApiModel):
    """A ConfigMap's keys as files."""

    name: str = Field(max_length=253, pattern=DNS_SUBDOMAIN, description="The ConfigMap.")
    items: list[KeyToPath] = Field(
        default_factory=list, max_length=64, description="Only these keys (default: all)."
    )
    optional: bool | None = Field(default=None, description="Start even if it is missing.")


class EmptyDirVolume(ApiModel):
    """A scratch directory that lives as long as the pod."""

    medium: Literal["", "Memory"] = Field(
        default="", description="Memory: a tmpfs (counted against the pod's memory)."
    )
    size_limit: Quantity | None = Field(default=None, description="At most this much.")


class ClaimVolume(ApiModel):
    """A PersistentVolumeClaim in the model's namespace."""

    claim_name: str = Field(max_length=253, pattern=DNS_SUBDOMAIN, description="The PVC.")
    read_only: bool = Field(default=False, description="Mount it read-only.")


def _sources(volume: Volume) -> int:
    sources = (volume.secret, volume.config_map, volume.empty_dir, volume.persistent_volume_claim)
    return sum(source is not None for source in sources)


class Volume(ApiModel):
    """A volume of the pool's pods: a Secret, a ConfigMap, an emptyDir or a PVC."""

    name: str = Field(max_length=63, pattern=DNS_LABEL, description="Unique in the pod.")
    secret: SecretVolume | None = Field(default=None, description="A Secret's keys.")
    config_map: ConfigMapVolume | None = Field(default=None, description="A ConfigMap's keys.")
    empty_dir: EmptyDirVolume | None = Field(default=None, description="A scratch directory.")
    persistent_volume_claim: ClaimVolume | None = Field(default=None, description="A PVC.")

    rules: ClassVar = (
        Rule(
            cel="[has(self.secret), has(self.configMap), has(self.emptyDir), "
            "has(self.persistentVolumeClaim)].filter(x, x).size() == 1",
            message="volumes: set exactly one of secret, configMap, emptyDir, "
            "persistentVolumeClaim",
            check=lambda m: _sources(m) == 1,
        ),
        Rule(
            cel=f"!(self.name in {list(OPERATOR_VOLUMES)})",
            message=f"volumes: the names {', '.join(OPERATOR_VOLUMES)} are the operator's",
            check=lambda m: m.name not in OPERATOR_VOLUMES,
            field_path=".name",
        ),
    )


class VolumeMount(ApiModel):
    """Where the engine container mounts one of the pool's volumes."""

    name: str = Field(max_length=63, pattern=DNS_LABEL, description="A volume of the pool.")
    mount_path: str = Field(
        min_length=2, max_length=4096, pattern=r"^/", description="Absolute path."
    )
    read_only: bool | None = Field(default=None, description="Mount it read-only.")
    sub_path: str | None = Field(
        default=None,
        max_length=4096,
        pattern=_DESCENDING,
        description="A relative path inside the volume.",
    )

    rules: ClassVar = (
        Rule(
            cel="!(self.mountPath in "
            + str(list(OPERATOR_MOUNTS))
            + ") && "
            + " && ".join(f"!self.mountPath.startsWith('{m}/')" for m in OPERATOR_MOUNTS),
            message=f"volumeMounts: {', '.join(OPERATOR_MOUNTS)} and below are the operator's",
            check=lambda m: (
                not any(
                    m.mount_path == p or m.mount_path.startswith(p + "/") for p in OPERATOR_MOUNTS
                )
            ),
            field_path=".mountPath",
        ),
    )


def _reserved(keys: dict[str, str]) -> bool:
    return any(key.startswith(RESERVED_PREFIXES) for key in keys)


_RESERVED_CEL: Final = " || ".join(f"k.startsWith('{p}')" for p in RESERVED_PREFIXES)


class PodSettings(ApiModel):
    """Settings of a pool's pods that the operator passes through."""

    service_account_name: str | None = Field(
        default=None,
        max_length=253,
        pattern=DNS_SUBDOMAIN,
        description="ServiceAccount of the pool's pods (default: the namespace's default).",
    )
    automount_service_account_token: bool = Field(
        default=False,
        description="Mount the ServiceAccount's token (workload identity for the weights' "
        "bucket, say); off by default: the engines never call the Kubernetes API.",
    )
    runtime_class_name: str | None = Field(
        default=None, max_length=63, pattern=DNS_LABEL, description="RuntimeClass of the pods."
    )
    labels: dict[str, Annotated[str, Field(max_length=63, pattern=LABEL_VALUE)]] = Field(
        default_factory=dict, max_length=64, description="Extra labels on the pool's pods."
    )
    annotations: dict[str, Annotated[str, Field(max_length=4096)]] = Field(
        default_factory=dict, max_length=64, description="Extra annotations on the pool's pods."
    )
    volumes: list[Volume] = Field(
        default_factory=list, max_length=32, description="Volumes of your own in the pods."
    )
    volume_mounts: list[VolumeMount] = Field(
        default_factory=list, max_length=32, description="Mounts of them in the engine container."
    )

    rules: ClassVar = (
        label_keys_rule(
            "labels",
            "labels",
            "pod.labels: each key must be a label key: an optional DNS-subdomain prefix and "
            "'/', then at most 63 letters, digits, '-', '_' or '.', starting and ending with a "
            "letter or digit",
        ),
        label_keys_rule(
            "annotations",
            "annotations",
            "pod.annotations: each key must be a qualified name (judged lowercased): an "
            "optional DNS-subdomain prefix and '/', then at most 63 letters, digits, '-', '_' "
            "or '.', starting and ending with a letter or digit",
            lowered=True,
        ),
        Rule(
            cel=f"(!has(self.labels) || !self.labels.exists(k, {_RESERVED_CEL})) && "
            f"(!has(self.annotations) || !self.annotations.exists(k, {_RESERVED_CEL}))",
            message="pod: labels and annotations under "
            f"{', '.join(RESERVED_PREFIXES)} are the operator's",
            check=lambda m: not _reserved(m.labels) and not _reserved(m.annotations),
        ),
        Rule(
            cel="!has(self.volumes) || self.volumes.all(v, "
            "self.volumes.filter(w, w.name == v.name).size() == 1)",
            message="pod.volumes: each name once",
            check=lambda m: len({v.name for v in m.volumes}) == len(m.volumes),
            field_path=".volumes",
        ),
        Rule(
            cel="!has(self.volumeMounts) || self.volumeMounts.all(m, "
            "has(self.volumes) && self.volumes.exists(v, v.name == m.name))",
            message="pod.volumeMounts: each names one of pod.volumes",
            check=lambda m: all(
                any(v.name == mount.name for v in m.volumes) for mount in m.volume_mounts
            ),
            field_path=".volumeMounts",
        ),
        Rule(
            cel="!has(self.volumeMounts) || self.volumeMounts.all(m, "
            "self.volumeMounts.filter(n, n.mountPath == m.mountPath).size() == 1)",
            message="pod.volumeMounts: each mountPath once",
            check=lambda m: len({x.mount_path for x in m.volume_mounts}) == len(m.volume_mounts),
            field_path=".volumeMounts",
        ),
    )
