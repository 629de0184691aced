"""kube/client.py reads the environment's proxy and netrc settings once, not on every request."""

from __future__ import annotations

import pytest
from kubernetes.aio import client as kclient

from kube.client import KubeApi, read_environment_once


@pytest.fixture(autouse=True)
def no_proxy_variables(monkeypatch):
    for name in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "NO_PROXY", "no_proxy"):
        monkeypatch.delenv(name, raising=False)


def test_the_proxy_the_environment_names_becomes_the_configurations_own(monkeypatch):
    monkeypatch.setenv("HTTPS_PROXY", "http://user:secret@proxy.internal:3128")
    configuration = kclient.Configuration(host="https://api.cluster.example:443")
    read_environment_once(configuration)
    assert configuration.client_session_kwargs == {"trust_env": False}
    assert configuration.proxy == "http://proxy.internal:3128"
    assert configuration.proxy_headers["Proxy-Authorization"].startswith("Basic ")


def test_no_proxy_leaves_the_api_server_direct(monkeypatch):
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.internal:3128")
    monkeypatch.setenv("NO_PROXY", "api.cluster.example")
    configuration = kclient.Configuration(host="https://api.cluster.example:443")
    read_environment_once(configuration)
    assert configuration.proxy is None and configuration.client_session_kwargs == {"trust_env": False}


def test_an_explicit_proxy_is_kept_and_every_constructor_settles_the_environment(monkeypatch):
    monkeypatch.setenv("HTTP_PROXY", "http://other:3128")
    configuration = kclient.Configuration(host="http://127.0.0.1:6443")
    configuration.proxy = "http://chosen:8080"
    read_environment_once(configuration)
    assert configuration.proxy == "http://chosen:8080"
    kube = KubeApi.for_host("http://127.0.0.1:6443")
    assert kube._client.configuration.client_session_kwargs == {"trust_env": False}
    assert kube._client.configuration.proxy == "http://other:3128"
