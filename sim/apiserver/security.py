"""The emulator's secure mode: TLS, bearer-token authentication and RBAC authorization, as
kube-apiserver does them, so that a deployment's ServiceAccount and ClusterRole can be proven here.

- TLS: a CA made for the run (trustme) signs the server certificate for 127.0.0.1 and localhost;
  kubeconfigs carry the CA, and a pod's `ca.crt` is the same CA.
- Authentication: `Authorization: Bearer <token>`. The admin token (in the admin kubeconfig) is
  `kubernetes-admin` in `system:masters`; ServiceAccount tokens come from the TokenRequest API
  (`POST .../serviceaccounts/<name>/token`) and authenticate as
  `system:serviceaccount:<ns>:<name>` in `system:serviceaccounts`,
  `system:serviceaccounts:<ns>` and `system:authenticated`. No or an unknown token: 401.
- Authorization: `system:masters` may do anything. Everyone else gets what the stored
  ClusterRoleBindings and RoleBindings grant (apiGroups, resources with `*` and `resource/sub`,
  resourceNames, verbs, the User / Group / ServiceAccount subjects), plus the discovery documents
  that kube-apiserver's default `system:discovery` role gives every authenticated user. A refusal
  is 403 with kube-apiserver's message: `nodes "n1" is forbidden: User "..." cannot patch resource
  "nodes" in API group "" at the cluster scope`.

The simulator's own control endpoints (`/sim/...`) are not Kubernetes and stay open.
"""

from __future__ import annotations

import secrets
import ssl
import threading
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from sim.apiserver.errors import Forbidden, NotFound, Unauthorized

RBAC = "rbac.authorization.k8s.io"
ADMIN_NAME = "kubernetes-admin"
AUTHENTICATED = "system:authenticated"
UNAUTHENTICATED = "system:unauthenticated"
# What kube-apiserver's default system:discovery / system:public-info-viewer roles give everyone.
DISCOVERY_PREFIXES = ("/api", "/apis", "/openapi", "/version", "/healthz", "/livez", "/readyz")


@dataclass(frozen=True)
class User:
    name: str
    groups: tuple[str, ...]

    @property
    def is_admin(self) -> bool:
        return "system:masters" in self.groups


ANONYMOUS = User("system:anonymous", (UNAUTHENTICATED,))


class Tls:
    """A CA and a server certificate for this run; PEM files under `directory` for clients."""

    def __init__(self, directory: Path) -> None:
        import trustme

        self.ca = trustme.CA(organization_name="karpflow emulator")
        self._server = self.ca.issue_cert("127.0.0.1", "localhost")
        directory.mkdir(parents=True, exist_ok=True)
        self.ca_file = directory / "ca.crt"
        self.ca.cert_pem.write_to_path(str(self.ca_file))

    @property
    def ca_pem(self) -> bytes:
        return self.ca.cert_pem.bytes()

    def server_context(self) -> ssl.SSLContext:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self._server.configure_cert(context)
        return context


class Tokens:
    """Bearer tokens: the admin's, and the ServiceAccount tokens the TokenRequest API issued."""

    def __init__(self) -> None:
        self.admin_token = secrets.token_urlsafe(32)
        self._users: dict[str, tuple[User, datetime | None]] = {
            self.admin_token: (User(ADMIN_NAME, ("system:masters", AUTHENTICATED)), None)
        }
        self._lock = threading.Lock()

    def issue(self, namespace: str, name: str, seconds: int = 3600) -> tuple[str, datetime]:
        token = secrets.token_urlsafe(32)
        expires = datetime.now(UTC) + timedelta(seconds=seconds)
        user = User(
            f"system:serviceaccount:{namespace}:{name}",
            ("system:serviceaccounts", f"system:serviceaccounts:{namespace}", AUTHENTICATED),
        )
        with self._lock:
            self._users[token] = (user, expires)
        return token, expires

    def identify(self, header: str | None) -> User | None:
        """Whom a bearer token names (None: no token, or not one of ours, or expired), without
        refusing anyone: how the emulator counts its callers when it does not check them."""
        try:
            return self.authenticate(header)
        except Unauthorized:
            return None

    def authenticate(self, header: str | None) -> User:
        scheme, _, token = (header or "").partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise Unauthorized("Unauthorized")
        with self._lock:
            found = self._users.get(token.strip())
        if found is None or (found[1] is not None and found[1] <= datetime.now(UTC)):
            raise Unauthorized("Unauthorized")
        return found[0]


@dataclass(frozen=True)
class Request:
    """One resource request, as RBAC sees it."""

    verb: str
    group: str
    resource: str  # plural
    subresource: str | None
    namespace: str | None
    name: str | None

    @property
    def resource_path(self) -> str:
        return f"{self.resource}/{self.subresource}" if self.subresource else self.resource


def _has(values: list[str] | None, wanted: str) -> bool:
    return bool(values) and ("*" in values or wanted in values)  # type: ignore[operator]


def rule_allows(rule: dict[str, Any], request: Request) -> bool:
    if not _has(rule.get("verbs"), request.verb) or not _has(rule.get("apiGroups"), request.group):
        return False
    resources = rule.get("resources") or []
    if not (
        "*" in resources
        or request.resource_path in resources
        or (request.subresource is not None and f"*/{request.subresource}" in resources)
    ):
        return False
    names = rule.get("resourceNames") or []
    return not names or (request.name is not None and request.name in names)


def subject_matches(subject: dict[str, Any], user: User, binding_namespace: str | None) -> bool:
    kind = subject.get("kind")
    if kind == "User":
        return subject.get("name") == user.name
    if kind == "Group":
        return subject.get("name") in user.groups
    if kind == "ServiceAccount":
        namespace = subject.get("namespace") or binding_namespace
        return user.name == f"system:serviceaccount:{namespace}:{subject.get('name')}"
    return False


class Authorizer:
    """RBAC over the objects in the store, read at each decision (the store is in memory)."""

    def __init__(self, store: Any) -> None:
        self.store = store

    def _rules(self, kind: str, name: str, namespace: str | None) -> list[dict[str, Any]]:
        try:
            if kind == "ClusterRole":
                return self.store.get("clusterroles", name).get("rules") or []
            if kind == "Role" and namespace:
                return self.store.get("roles", name, namespace).get("rules") or []
        except NotFound:
            return []  # a binding to a missing role grants nothing, as in Kubernetes
        return []

    def allows(self, user: User, request: Request) -> bool:
        if user.is_admin:
            return True
        for binding in self.store.list("clusterrolebindings").items:
            if any(subject_matches(s, user, None) for s in binding.get("subjects") or ()):
                ref = binding.get("roleRef") or {}
                if ref.get("kind") == "ClusterRole" and any(
                    rule_allows(r, request) for r in self._rules("ClusterRole", ref.get("name", ""), None)
                ):
                    return True
        if request.namespace:
            for binding in self.store.list("rolebindings", request.namespace).items:
                if any(subject_matches(s, user, request.namespace) for s in binding.get("subjects") or ()):
                    ref = binding.get("roleRef") or {}
                    rules = self._rules(ref.get("kind", ""), ref.get("name", ""), request.namespace)
                    if any(rule_allows(r, request) for r in rules):
                        return True
        return False

    def check(self, user: User, request: Request) -> None:
        if not self.allows(user, request):
            raise forbidden(user, request)


def forbidden(user: User, request: Request) -> Forbidden:
    """kube-apiserver's wording, so clients and people see what they would see on a real cluster."""
    group_resource = f"{request.resource}.{request.group}" if request.group else request.resource
    subject = f'{group_resource} "{request.name}"' if request.name else group_resource
    where = f'in the namespace "{request.namespace}"' if request.namespace else "at the cluster scope"
    message = (
        f'{subject} is forbidden: User "{user.name}" cannot {request.verb} resource '
        f'"{request.resource_path}" in API group "{request.group}" {where}'
    )
    return Forbidden(message, name=request.name, group=request.group, kind=request.resource)


def non_resource_allowed(user: User, path: str) -> bool:
    return user.is_admin or any(path == p or path.startswith(p + "/") for p in DISCOVERY_PREFIXES)
