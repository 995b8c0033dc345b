"""Where the operator and the router find the API server: a kubeconfig when one is named or
present, else the pod's service account, read without a Kubernetes client library."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from disagg.kube.credentials import CredentialsError, in_cluster, load_credentials

POD_ENV = {"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443"}


@pytest.fixture
def service_account(tmp_path: Path) -> Path:
    directory = tmp_path / "serviceaccount"
    directory.mkdir()
    (directory / "token").write_text("first-token\n")
    (directory / "ca.crt").write_text("-----BEGIN CERTIFICATE-----\n")
    return directory


def test_a_pod_reads_its_service_account_and_follows_the_rotated_token(
    service_account: Path,
) -> None:
    creds = in_cluster(POD_ENV, service_account)
    assert creds.host == "https://10.96.0.1:443"
    assert creds.token == "first-token" and creds.verify
    assert creds.ca_file == str(service_account / "ca.crt")
    (service_account / "token").write_text("rotated-token")
    assert creds.refresh is not None and creds.refresh() == "rotated-token"


def test_an_ipv6_service_address_is_bracketed(service_account: Path) -> None:
    env = {**POD_ENV, "KUBERNETES_SERVICE_HOST": "fd00::1"}
    assert in_cluster(env, service_account).host == "https://[fd00::1]:443"


def test_outside_a_pod_without_a_kubeconfig_the_error_names_both_sources(
    service_account: Path,
) -> None:
    with pytest.raises(CredentialsError, match="KUBERNETES_SERVICE_HOST") as caught:
        in_cluster({}, service_account)
    assert "--kubeconfig" in str(caught.value)


def test_a_pod_without_a_mounted_token_is_told_why(service_account: Path) -> None:
    (service_account / "token").unlink()
    with pytest.raises(CredentialsError, match="automountServiceAccountToken"):
        in_cluster(POD_ENV, service_account)


def _kubeconfig(path: Path, server: str) -> Path:
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": server}}],
                "users": [{"name": "u", "user": {"token": "kubeconfig-token"}}],
                "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "x",
            }
        )
    )
    return path


def test_kubeconfig_from_the_environment_wins_over_the_service_account(
    tmp_path: Path, service_account: Path
) -> None:
    config = _kubeconfig(tmp_path / "config", "https://api.example:6443")
    env = {**POD_ENV, "KUBECONFIG": str(config)}
    creds = load_credentials(None, env, service_account)
    assert (creds.host, creds.token) == ("https://api.example:6443", "kubeconfig-token")


def test_a_named_kubeconfig_that_does_not_load_is_an_error_naming_it(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere"
    with pytest.raises(CredentialsError, match=str(missing)):
        load_credentials(str(missing), POD_ENV)
