"""Where the local control plane keeps its files, and which ports it listens on.

Everything lives under one state directory (``$DISAGG_DEV_DIR``, default
``~/.cache/disagg/dev``): certificates, tokens, the kubeconfig, logs, and ``state.json``
with the ports and process ids. etcd's data sits on tmpfs (``/dev/shm``) because it is
throwaway and fsync on a disk would dominate the API server's latency.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
from dataclasses import asdict, dataclass, field
from pathlib import Path

COMPONENTS = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok")
POD_CIDR_PREFIX = "127.42"
"""Pod IPs come from 127.42.<node>.0/24 so a process can listen on a pod's own IP."""
NODE_IP = "127.41.0.1"


def cache_dir() -> Path:
    """The machine-local cache of built binaries and dev state."""
    return Path(os.environ.get("DISAGG_CACHE", Path.home() / ".cache" / "disagg"))


def default_state_dir() -> Path:
    """The state directory of the local control plane."""
    return Path(os.environ.get("DISAGG_DEV_DIR", cache_dir() / "dev"))


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def port_in_use(port: int) -> bool:
    """Whether something accepts connections on 127.0.0.1:port."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(0.5)
        return sock.connect_ex(("127.0.0.1", port)) == 0


@dataclass
class Ports:
    """Every loopback port of the control plane."""

    etcd_client: int
    etcd_peer: int
    apiserver: int
    controller_manager: int
    scheduler: int
    kwok: int

    @classmethod
    def allocate(cls) -> Ports:
        return cls(*(free_port() for _ in range(6)))


@dataclass
class State:
    """What `disagg dev up` recorded: ports and the pid of each running component."""

    ports: Ports
    pids: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class Layout:
    """Paths of one local control plane."""

    root: Path

    @property
    def pki(self) -> Path:
        return self.root / "pki"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    @property
    def kubeconfig(self) -> Path:
        return self.root / "kubeconfig"

    @property
    def state_file(self) -> Path:
        return self.root / "state.json"

    @property
    def tokens(self) -> Path:
        return self.pki / "tokens.csv"

    @property
    def kwok_config(self) -> Path:
        return self.root / "kwok.yaml"

    @property
    def etcd_data(self) -> Path:
        # One data dir per state dir, so parallel harnesses (tests, a user's) never share.
        tag = hashlib.sha256(str(self.root.resolve()).encode()).hexdigest()[:10]
        base = Path("/dev/shm") if Path("/dev/shm").is_dir() else self.root
        return base / f"disagg-etcd-{tag}"

    def log(self, component: str) -> Path:
        return self.logs / f"{component}.log"

    def load_state(self) -> State | None:
        if not self.state_file.exists():
            return None
        raw = json.loads(self.state_file.read_text())
        return State(ports=Ports(**raw["ports"]), pids=dict(raw.get("pids", {})))

    def save_state(self, state: State) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        tmp = self.state_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(state), indent=2))
        tmp.replace(self.state_file)
