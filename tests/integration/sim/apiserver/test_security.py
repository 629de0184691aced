"""The emulator's secure mode with the real kubectl and the official client: HTTPS with its own CA,
bearer tokens (the admin's, ServiceAccount tokens from the TokenRequest API), RBAC from the stored
objects, and kube-apiserver's 401 and 403 answers."""

from __future__ import annotations

import json
import os
import shutil
import ssl
import subprocess
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from kubernetes import client

from sim.apiserver import EmulatorServer
from sim.timescale import TimeScale

from . import builders as b

KUBECTL = shutil.which("kubectl")
pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(KUBECTL is None, reason="kubectl is not on PATH"),
]
SA = "system:serviceaccount:karpflow:karpflow"


@pytest.fixture(scope="module")
def secure(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmulatorServer]:
    directory = tmp_path_factory.mktemp("secure")
    with EmulatorServer(timescale=TimeScale(0.01), secure_dir=directory) as srv:
        admin = client.CoreV1Api(srv.api_client())
        for namespace in ("karpflow", "shop"):
            admin.create_namespace({"metadata": {"name": namespace}})
        for name in ("karpflow", "other"):
            admin.create_namespaced_service_account("karpflow", {"metadata": {"name": name}})
        srv.store.create("nodes", b.node("n1"))
        yield srv


Kubectl = Callable[..., subprocess.CompletedProcess[str]]


def kubectl_as(srv: EmulatorServer, tmp_path: Path, token: str | None) -> Kubectl:
    config = srv.write_kubeconfig(tmp_path / f"kubeconfig-{abs(hash(token))}", token=token or "")
    if token is None:  # a kubeconfig with no credentials at all
        document = config.read_text().replace("token: ''", "{}").replace('token: ""', "{}")
        config.write_text(document)
    env = {**os.environ, "KUBECONFIG": str(config), "HOME": str(tmp_path)}

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([KUBECTL, *args], env=env, capture_output=True, text=True, timeout=30)

    return run


def token_request(srv: EmulatorServer, name: str) -> str:
    admin = client.CoreV1Api(srv.api_client())
    answer = admin.create_namespaced_service_account_token(
        name, "karpflow", {"spec": {"expirationSeconds": 3600}}
    )
    return answer.status.token


def bind(srv: EmulatorServer, name: str, rules: list[dict]) -> None:
    rbac = client.RbacAuthorizationV1Api(srv.api_client())
    rbac.create_cluster_role({"metadata": {"name": name}, "rules": rules})
    rbac.create_cluster_role_binding(
        {
            "metadata": {"name": name},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
            "subjects": [{"kind": "ServiceAccount", "name": "karpflow", "namespace": "karpflow"}],
        }
    )


def raw_get(srv: EmulatorServer, path: str, token: str | None) -> tuple[int, dict]:
    context = ssl.create_default_context(cafile=str(srv.tls.ca_file))  # type: ignore[union-attr]
    request = urllib.request.Request(srv.url + path)
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, context=context, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def test_https_with_the_runs_ca_and_the_admin_token(secure, tmp_path):
    assert secure.url.startswith("https://127.0.0.1:")
    kubectl = kubectl_as(secure, tmp_path, secure.admin_token)
    shown = kubectl("get", "nodes", "-o", "name")
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.split() == ["node/n1"]


def test_no_token_or_an_unknown_one_is_401_as_kube_apiserver_says_it(secure, tmp_path):
    for token in (None, "not-a-token"):
        status, body = raw_get(secure, "/api/v1/nodes", token)
        assert status == 401
        assert body == {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": "Unauthorized",
            "reason": "Unauthorized",
            "code": 401,
        }
    shown = kubectl_as(secure, tmp_path, "not-a-token")("get", "nodes")
    # kubectl 1.32 words a 401 so, against a real cluster too.
    assert (
        "You must be logged in to the server (the server has asked for the client to provide" in shown.stderr
    )


def test_a_service_account_gets_what_its_bindings_grant_and_403_for_the_rest(secure, tmp_path):
    token = token_request(secure, "karpflow")
    kubectl = kubectl_as(secure, tmp_path, token)
    refused = kubectl("get", "nodes")
    assert refused.returncode != 0
    assert (
        'Error from server (Forbidden): nodes is forbidden: User "system:serviceaccount:karpflow:karpflow" '
        'cannot list resource "nodes" in API group "" at the cluster scope'
    ) in refused.stderr

    bind(
        secure, "read-nodes", [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch"]}]
    )
    assert kubectl("get", "nodes", "-o", "name").stdout.split() == ["node/n1"]
    patched = kubectl("label", "node", "n1", "team=web")
    assert (
        f'nodes "n1" is forbidden: User "{SA}" cannot patch resource "nodes" in API group "" '
        "at the cluster scope"
    ) in patched.stderr

    # The same grant does not reach another ServiceAccount.
    other = kubectl_as(secure, tmp_path, token_request(secure, "other"))("get", "nodes")
    assert 'User "system:serviceaccount:karpflow:other" cannot list resource "nodes"' in other.stderr
    # Discovery needs no grant (kube-apiserver's system:discovery role).
    assert raw_get(secure, "/api", token)[0] == 200


def test_namespaced_grants_subresources_and_resource_names(secure, tmp_path):
    rbac = client.RbacAuthorizationV1Api(secure.api_client())
    rbac.create_namespaced_role(
        "shop",
        {
            "metadata": {"name": "evict"},
            "rules": [
                {"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]},
                {"apiGroups": [""], "resources": ["pods/eviction"], "verbs": ["create"]},
                {
                    "apiGroups": [""],
                    "resources": ["configmaps"],
                    "resourceNames": ["settings"],
                    "verbs": ["get"],
                },
            ],
        },
    )
    rbac.create_namespaced_role_binding(
        "shop",
        {
            "metadata": {"name": "evict"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "evict"},
            "subjects": [{"kind": "ServiceAccount", "name": "karpflow", "namespace": "karpflow"}],
        },
    )
    token = token_request(secure, "karpflow")
    assert raw_get(secure, "/api/v1/namespaces/shop/pods", token)[0] == 200
    status, body = raw_get(secure, "/api/v1/namespaces/karpflow/pods", token)
    assert status == 403
    assert body["message"] == (
        f'pods is forbidden: User "{SA}" cannot list resource "pods" in API group "" '
        'in the namespace "karpflow"'
    )
    assert body["details"] == {"kind": "pods"} and body["reason"] == "Forbidden"
    assert raw_get(secure, "/api/v1/namespaces/shop/configmaps/settings", token)[0] == 404  # allowed, absent
    status, body = raw_get(secure, "/api/v1/namespaces/shop/configmaps/other", token)
    assert status == 403 and 'configmaps "other" is forbidden' in body["message"]

    sa_api = client.CoreV1Api(client.ApiClient(secure.client_configuration(token)))
    secure.store.create("pods", b.pod("web-0", "n1", namespace="shop"))
    sa_api.create_namespaced_pod_eviction(
        "web-0", "shop", {"metadata": {"name": "web-0", "namespace": "shop"}}
    )
    with pytest.raises(client.ApiException) as denied:
        sa_api.delete_namespaced_pod("web-0", "shop")
    assert denied.value.status == 403
    assert json.loads(denied.value.body)["message"].endswith(
        'cannot delete resource "pods" in API group "" in the namespace "shop"'
    )


def test_a_token_request_for_a_missing_service_account_is_404(secure):
    admin = client.CoreV1Api(secure.api_client())
    with pytest.raises(client.ApiException) as missing:
        admin.create_namespaced_service_account_token("ghost", "karpflow", {"spec": {}})
    assert missing.value.status == 404
