"""RDMA preflight of an engine pod (reads sysfs and /proc; decisions are pure functions).

What it checks, as an SRE would by hand with ``ibv_devinfo`` and ``ucx_info``:
RDMA devices present (``/sys/class/infiniband``) with an ACTIVE port, the user-verbs device
nodes (``/dev/infiniband/uverbs*``), that memory can be pinned (``CAP_IPC_LOCK`` or an
unlimited ``RLIMIT_MEMLOCK``), and that every device in ``UCX_NET_DEVICES`` exists and is
active. It also works out what only the pod can know: the list of active HCA ports for UCX,
and the RoCE v2 GID index when the link layer is Ethernet.
"""

from __future__ import annotations

import ipaddress
import resource
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

CAP_IPC_LOCK: Final = 14


@dataclass(frozen=True)
class Port:
    """One port of an RDMA device."""

    device: str
    number: int
    active: bool
    link_layer: str
    roce_v2_gid_index: int | None

    @property
    def ucx_name(self) -> str:
        return f"{self.device}:{self.number}"


@dataclass
class Findings:
    """What the preflight saw and what it concluded."""

    ports: list[Port] = field(default_factory=list)
    verbs_devices: list[str] = field(default_factory=list)
    can_pin_memory: bool = False
    problems: list[str] = field(default_factory=list)
    ucx_net_devices: str | None = None
    gid_index: int | None = None

    @property
    def usable(self) -> bool:
        return not self.problems


def _read(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return ""


def _roce_v2_index(port_dir: Path) -> int | None:
    types = port_dir / "gid_attrs" / "types"
    if not types.is_dir():
        return None
    for entry in sorted(
        types.iterdir(), key=lambda p: int(p.name) if p.name.isdigit() else 1 << 30
    ):
        if not entry.name.isdigit() or "roce v2" not in _read(entry).lower():
            continue
        gid = _read(port_dir / "gids" / entry.name)
        try:
            address = ipaddress.IPv6Address(gid)
        except ValueError:
            continue
        if address.ipv4_mapped is not None:  # the GID carrying the interface's IPv4 address
            return int(entry.name)
    return None


def scan_ports(sysfs: Path) -> list[Port]:
    """Every port of every RDMA device under ``<sysfs>/class/infiniband``."""
    root = sysfs / "class" / "infiniband"
    ports: list[Port] = []
    if not root.is_dir():
        return ports
    for device in sorted(root.iterdir()):
        for port_dir in sorted((device / "ports").glob("*")):
            if not port_dir.name.isdigit():
                continue
            state = _read(port_dir / "state")
            ports.append(
                Port(
                    device=device.name,
                    number=int(port_dir.name),
                    active="ACTIVE" in state.upper(),
                    link_layer=_read(port_dir / "link_layer") or "InfiniBand",
                    roce_v2_gid_index=_roce_v2_index(port_dir),
                )
            )
    return ports


def can_pin_memory(proc_status: str, memlock_soft: int) -> bool:
    """CAP_IPC_LOCK in the effective set, or no memlock limit at all (pure)."""
    if memlock_soft == resource.RLIM_INFINITY:
        return True
    for line in proc_status.splitlines():
        if line.startswith("CapEff:"):
            return bool(int(line.split()[1], 16) & (1 << CAP_IPC_LOCK))
    return False


def decide(
    ports: list[Port],
    verbs: list[str],
    pinnable: bool,
    requested: str | None,
    gid_index: str | None,
) -> Findings:
    """The preflight verdict from what was observed (pure)."""
    findings = Findings(ports=ports, verbs_devices=verbs, can_pin_memory=pinnable)
    active = [p for p in ports if p.active]
    if not ports:
        findings.problems.append(
            "no RDMA device under /sys/class/infiniband (is the device plugin resource requested?)"
        )
    elif not active:
        names = ", ".join(p.ucx_name for p in ports)
        findings.problems.append(
            f"no RDMA port is ACTIVE ({names}): check the cable, the subnet manager or the switch"
        )
    if ports and not verbs:
        findings.problems.append(
            "no /dev/infiniband/uverbs* device node: the RDMA device plugin did not mount it"
        )
    if not pinnable:
        findings.problems.append(
            "memory cannot be pinned: add the IPC_LOCK capability (or raise RLIMIT_MEMLOCK)"
        )
    by_name = {p.ucx_name: p for p in ports}
    by_device = {p.device: p for p in ports}
    if requested and requested != "all":
        for name in (n.strip() for n in requested.split(",") if n.strip()):
            port = by_name.get(name) or by_device.get(name)
            if port is None:
                known = ", ".join(sorted(by_name)) or "none"
                findings.problems.append(
                    f"UCX_NET_DEVICES names {name}, which this pod does not have (present: {known})"
                )
            elif not port.active:
                findings.problems.append(f"UCX_NET_DEVICES names {name}, whose port is not ACTIVE")
        findings.ucx_net_devices = requested
    elif active:
        findings.ucx_net_devices = ",".join(p.ucx_name for p in active)
    if gid_index is not None:
        findings.gid_index = int(gid_index)
    else:
        ethernet = [
            p
            for p in active
            if p.link_layer.lower() == "ethernet" and p.roce_v2_gid_index is not None
        ]
        if ethernet:
            findings.gid_index = ethernet[0].roce_v2_gid_index
    return findings


def preflight(sysfs: Path, dev: Path, requested: str | None, gid_index: str | None) -> Findings:
    """Look at this pod's RDMA setup."""
    verbs = (
        sorted(p.name for p in (dev / "infiniband").glob("uverbs*"))
        if (dev / "infiniband").is_dir()
        else []
    )
    status = _read(Path("/proc/self/status"))
    soft, _ = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    return decide(scan_ports(sysfs), verbs, can_pin_memory(status, soft), requested, gid_index)
