"""What the manifests enforce: non-root, locked-down Ray and router pods; ticket keys mounted
where routers sign and gateways verify; NetworkPolicies that leave a region only its gateway
port from outside; Redis ACL users that give the regions nothing beyond their own keys."""

from __future__ import annotations

import asyncio
import ipaddress
import os
import re
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.unit.infra.infra_files import INFRA, Doc, container, load_render, manifests, one

RAYSERVICES = manifests("RayService")
POLICIES = manifests("NetworkPolicy")
NAMESPACE_LABELS = {"kubernetes.io/metadata.name": "llm-scheduler",
                    **one("Namespace", "llm-scheduler").body["metadata"]["labels"]}


def ray_pods(doc: Doc) -> list[tuple[str, dict[str, Any]]]:
    """(group, pod template) of the head and every worker group."""
    cluster = doc.body["spec"]["rayClusterConfig"]
    return [("head", cluster["headGroupSpec"]["template"]),
            *((g["groupName"], g["template"]) for g in cluster["workerGroupSpecs"])]


# --- securityContext ---------------------------------------------------------------------


def _effective(pod: Mapping[str, Any], ctr: Mapping[str, Any]) -> dict[str, Any]:
    """A container's security settings with the pod's defaults under them (as the kubelet merges)."""
    return {**pod.get("securityContext", {}), **ctr.get("securityContext", {})}


def _assert_locked_down(where: str, pod: Mapping[str, Any], ctr: Mapping[str, Any], user: int) -> None:
    ctx = _effective(pod, ctr)
    assert ctx.get("runAsNonRoot") is True, where
    assert ctx.get("runAsUser") == user, where
    assert ctx.get("allowPrivilegeEscalation") is False, where
    assert ctx.get("capabilities", {}).get("drop") == ["ALL"], where
    assert not ctx.get("capabilities", {}).get("add"), where
    assert ctx.get("seccompProfile") == {"type": "RuntimeDefault"}, where
    assert not ctx.get("privileged"), where


@pytest.mark.parametrize("doc", RAYSERVICES, ids=lambda d: d.name)
def test_every_ray_pod_runs_locked_down(doc: Doc) -> None:
    render = load_render()
    user = render.default_options().run_as_user
    for group, template in ray_pods(doc):
        spec = template["spec"]
        assert not spec.get("hostNetwork") and not spec.get("hostPID") and not spec.get("hostIPC")
        for ctr in spec["containers"]:
            where = f"{doc.name}/{group}/{ctr['name']}"
            _assert_locked_down(where, spec, ctr, user)
            assert ctr["securityContext"]["readOnlyRootFilesystem"] is True, where
            # Read-only image: Ray's session dir and caches (HOME) on /tmp, the object store on
            # /dev/shm, both emptyDirs.
            volumes = {v["name"]: v for v in spec["volumes"]}
            mounts = {m["mountPath"]: volumes[m["name"]] for m in ctr["volumeMounts"]}
            assert "emptyDir" in mounts["/tmp"] and not mounts["/tmp"]["emptyDir"].get("medium"), where
            assert mounts["/dev/shm"]["emptyDir"]["medium"] == "Memory", where
            env = {e["name"]: e.get("value") for e in ctr["env"]}
            assert env["HOME"].startswith("/tmp") and env["SCHEDULER_CACHE"].startswith("/tmp"), where
            read_only = [m for m in ctr["volumeMounts"] if m["mountPath"] not in ("/tmp", "/dev/shm")]
            assert all(m.get("readOnly") for m in read_only), f"{where}: only /tmp and /dev/shm are writable"
    autoscaler = doc.body["spec"]["rayClusterConfig"]["autoscalerOptions"]["securityContext"]
    assert autoscaler["allowPrivilegeEscalation"] is False and autoscaler["capabilities"]["drop"] == ["ALL"]


@pytest.mark.parametrize("doc", RAYSERVICES, ids=lambda d: d.name)
def test_ray_control_plane_needs_a_token(doc: Doc) -> None:
    # The dashboard listens on every address (KubeRay calls it); a token guards it, the GCS and
    # the Ray client, beside the NetworkPolicy.
    cluster = doc.body["spec"]["rayClusterConfig"]
    assert cluster["headGroupSpec"]["rayStartParams"]["dashboard-host"] == "0.0.0.0"
    assert cluster["authOptions"] == {"mode": "token"}
    major, minor, _ = (int(x) for x in cluster["rayVersion"].split("."))
    assert (major, minor) >= (2, 52), "Ray token authentication needs Ray 2.52 or later"


def test_the_region_image_runs_as_the_pods_user() -> None:
    dockerfile = (INFRA / "images" / "region.Dockerfile").read_text()
    users = [line.split()[1] for line in dockerfile.splitlines() if line.startswith("USER ")]
    options = load_render().default_options()
    assert users and users[-1] == f"{options.run_as_user}:{options.run_as_group}"


def test_the_router_runs_locked_down() -> None:
    deployment = one("Deployment", "scheduler-router")
    spec = deployment.body["spec"]["template"]["spec"]
    router = container(deployment, "router")
    dockerfile = (INFRA / "images" / "router.Dockerfile").read_text()
    (image_user,) = [line.split()[1] for line in dockerfile.splitlines() if line.startswith("USER ")]
    _assert_locked_down("router", spec, router, int(image_user))
    assert router["securityContext"]["readOnlyRootFilesystem"] is True


# --- dispatch-ticket keys ----------------------------------------------------------------


def _secret_mount(spec: Mapping[str, Any], ctr: Mapping[str, Any], path: str) -> dict[str, Any]:
    """The Secret volume mounted at ``path``'s folder, read-only, carrying ``path``'s file."""
    folder, name = path.rsplit("/", 1)
    (mount,) = [m for m in ctr["volumeMounts"] if m["mountPath"] == folder]
    assert mount.get("readOnly") is True, f"{folder} must be mounted read-only"
    (volume,) = [v for v in spec["volumes"] if v["name"] == mount["name"]]
    assert "secret" in volume, f"{folder} is not a Secret"
    assert name in {i["path"] for i in volume["secret"].get("items", [{"path": name}])}
    return dict(volume["secret"])


@pytest.mark.parametrize("doc", RAYSERVICES, ids=lambda d: d.name)
def test_every_ray_pod_mounts_its_regions_ticket_keys(doc: Doc) -> None:
    # The gateway may run on any Ray node: head and workers alike carry the keys.
    for group, template in ray_pods(doc):
        spec = template["spec"]
        for ctr in spec["containers"]:
            env = {e["name"]: e for e in ctr["env"]}
            path = env["SCHEDULER_TICKET_KEYS_FILE"]["value"]
            secret = _secret_mount(spec, ctr, path)
            assert secret["secretName"] == f"scheduler-tickets-{doc.name}", group
            # The gateway's Redis user, not the router's.
            assert env["SCHEDULER_STATE"]["valueFrom"]["secretKeyRef"]["name"] == "scheduler-redis-region", group


def test_the_router_mounts_every_regions_ticket_keys() -> None:
    deployment = one("Deployment", "scheduler-router")
    router = container(deployment, "router")
    args = list(router["args"])
    path = next(a.split("=", 1)[1] for a in args if a.startswith("--ticket-keys="))
    secret = _secret_mount(deployment.body["spec"]["template"]["spec"], router, path)
    assert secret["secretName"] == "scheduler-tickets-router"
    env = {e["name"]: e for e in router["env"]}
    assert env["SCHEDULER_STATE"]["valueFrom"]["secretKeyRef"]["name"] == "scheduler-redis-router"


# --- NetworkPolicy -----------------------------------------------------------------------


@dataclass(frozen=True)
class Peer:
    """Where a connection comes from: a pod (its labels, its namespace's labels, whether that
    is our namespace) or, with ``ip``, an address outside the cluster."""

    name: str
    labels: Mapping[str, str] = field(default_factory=dict)
    namespace: Mapping[str, str] | None = None
    same_namespace: bool = False
    ip: str | None = None


def _selects(selector: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    if any(labels.get(k) != v for k, v in selector.get("matchLabels", {}).items()):
        return False
    for expr in selector.get("matchExpressions", []):
        key, op, values = expr["key"], expr["operator"], expr.get("values", [])
        ok = {"Exists": key in labels, "DoesNotExist": key not in labels,
              "In": labels.get(key) in values, "NotIn": labels.get(key) not in values}[op]
        if not ok:
            return False
    return True


def _peer_matches(entry: Mapping[str, Any], peer: Peer) -> bool:
    if "ipBlock" in entry:
        if peer.ip is None:
            return False
        address = ipaddress.ip_address(peer.ip)
        block = entry["ipBlock"]
        return address in ipaddress.ip_network(block["cidr"]) and not any(
            address in ipaddress.ip_network(e) for e in block.get("except", []))
    if peer.namespace is None:
        return False
    namespaces, pods = entry.get("namespaceSelector"), entry.get("podSelector")
    ns_ok = _selects(namespaces, peer.namespace) if namespaces is not None else peer.same_namespace
    return ns_ok and (pods is None or _selects(pods, peer.labels))


def admitted(policies: list[Doc], target: Mapping[str, str], peer: Peer, port: int) -> bool:
    """Kubernetes NetworkPolicy ingress semantics for one pod of our namespace: isolated once a
    policy selects it, then allowed if any rule of any selecting policy allows."""
    selecting = [p.body["spec"] for p in policies if _selects(p.body["spec"]["podSelector"], target)
                 and "Ingress" in p.body["spec"].get("policyTypes", ["Ingress"])]
    if not selecting:
        return True
    for spec in selecting:
        for rule in spec.get("ingress", []):
            ports = rule.get("ports")
            if ports and not any(p.get("port") == port for p in ports):
                continue
            peers = rule.get("from")
            if not peers or any(_peer_matches(e, peer) for e in peers):
                return True
    return False


ROUTER = {"app.kubernetes.io/name": "scheduler-router", "app.kubernetes.io/part-of": "carbon-scheduler"}
OPS = {"kubernetes.io/metadata.name": "ops", "scheduler/ops": "true"}
MONITORING = {"kubernetes.io/metadata.name": "monitoring", "scheduler/monitoring": "true"}
KUBERAY = {"kubernetes.io/metadata.name": "kuberay-system", "scheduler/kuberay-operator": "true"}
DIRECT_NS = {"kubernetes.io/metadata.name": "batch", "scheduler/direct-clients": "true"}
PLAIN_NS = {"kubernetes.io/metadata.name": "tenant-a"}
# Ray's ports: the Serve gateway, metrics, dashboard, GCS, Ray client, dashboard agent and a
# raylet / worker port from Ray's dynamic range.
RAY_PORTS = (8000, 8080, 8265, 6379, 10001, 52365, 12345)


def _region_peers(region: str, other: str) -> Iterator[tuple[Peer, set[int]]]:
    """Each peer of a region's Ray pods and exactly the ports it may reach."""
    every = set(RAY_PORTS)
    yield Peer("router", ROUTER, NAMESPACE_LABELS, True), {8000}
    yield Peer("same region", {"scheduler/region": region}, NAMESPACE_LABELS, True), every
    yield Peer("other region", {"scheduler/region": other}, NAMESPACE_LABELS, True), set()
    yield Peer("unlabelled pod, our namespace", {"app": "x"}, NAMESPACE_LABELS, True), set()
    yield Peer("ops namespace", {}, OPS), every
    yield Peer("monitoring namespace", {"app": "prometheus"}, MONITORING), {8080}
    yield Peer("KubeRay operator", {"app.kubernetes.io/name": "kuberay-operator"}, KUBERAY), {8265, 8000}
    yield Peer("direct client", {"scheduler/direct-client": "true"}, DIRECT_NS), {8000}
    yield Peer("unlabelled pod, direct-client namespace", {}, DIRECT_NS), set()
    # Pod labels are the workload's own choice: in a namespace nobody labelled, none opens a port.
    for labels in ({}, {"scheduler/direct-client": "true"}, {"scheduler/region": region}, ROUTER):
        yield Peer(f"pod {labels} in another namespace", labels, PLAIN_NS), set()
    yield Peer("outside the cluster", ip="203.0.113.7"), set()


@pytest.mark.parametrize("doc", RAYSERVICES, ids=lambda d: d.name)
def test_region_pods_admit_the_gateway_port_from_outside_and_ray_ports_only_inside(doc: Doc) -> None:
    other = next(d.name for d in RAYSERVICES if d.name != doc.name)
    for group, template in ray_pods(doc):
        target = template["metadata"]["labels"]
        for peer, allowed in _region_peers(doc.name, other):
            got = {port for port in RAY_PORTS if admitted(POLICIES, target, peer, port)}
            assert got == allowed, f"{doc.name}/{group} from {peer.name}: admits {sorted(got)}, expected {sorted(allowed)}"


@pytest.mark.parametrize("doc", RAYSERVICES, ids=lambda d: d.name)
def test_from_an_unlabelled_namespace_only_the_gateway_port_is_open(doc: Doc) -> None:
    """Stated rule by rule: a rule reaching beyond our namespace (other than to the namespaces
    an admin labelled ops, monitoring or KubeRay) opens the gateway port and nothing else."""
    admin_labels = ({"scheduler/ops": "true"}, {"scheduler/monitoring": "true"}, {"scheduler/kuberay-operator": "true"})
    policies = [p for p in POLICIES if _selects(p.body["spec"]["podSelector"], {"scheduler/region": doc.name})]
    assert any(p.name == f"{doc.name}-ray" for p in policies)
    for policy in policies:
        for rule in policy.body["spec"].get("ingress", []):
            outside = [e for e in rule.get("from", [{}]) if "ipBlock" in e or "namespaceSelector" in e or not e]
            outside = [e for e in outside if e.get("namespaceSelector", {}).get("matchLabels") not in admin_labels]
            if outside:
                assert rule.get("ports") == [{"protocol": "TCP", "port": 8000}], (policy.name, rule)


def test_namespace_denies_ingress_by_default() -> None:
    deny = one("NetworkPolicy", "default-deny-ingress").body
    assert deny["spec"]["podSelector"] == {} and deny["spec"]["policyTypes"] == ["Ingress"]
    assert not deny["spec"].get("ingress")
    assert deny["metadata"]["namespace"] == "llm-scheduler"
    stray = {"app": "something-else"}
    for peer in (Peer("ops", {}, OPS), Peer("ours", {}, NAMESPACE_LABELS, True), Peer("ip", ip="10.0.0.1")):
        assert not any(admitted(POLICIES, stray, peer, port) for port in (80, 8000, 6379))


def test_redis_admits_only_routers_regions_and_ops() -> None:
    redis = one("StatefulSet", "redis").body["spec"]["template"]["metadata"]["labels"]
    cases = [
        (Peer("router", ROUTER, NAMESPACE_LABELS, True), {6379}),
        (Peer("region", {"scheduler/region": "eu-north", "scheduler/pool": "h200-long"}, NAMESPACE_LABELS, True), {6379}),
        (Peer("ops", {}, OPS), {6379, 9121}),
        (Peer("prometheus", {}, MONITORING), {9121}),
        (Peer("other pod, our namespace", {"app": "x"}, NAMESPACE_LABELS, True), set()),
        (Peer("router-labelled pod elsewhere", ROUTER, PLAIN_NS), set()),
        (Peer("outside", ip="198.51.100.1"), set()),
    ]
    for peer, allowed in cases:
        got = {port for port in (6379, 9121) if admitted(POLICIES, redis, peer, port)}
        assert got == allowed, f"redis from {peer.name}: {sorted(got)}"


def test_router_grpc_and_http_are_open_and_its_metrics_are_not() -> None:
    router = one("Deployment", "scheduler-router").body["spec"]["template"]["metadata"]["labels"]
    for port in (50051, 8080):  # gRPC and the HTTP front door: every call carries a key
        assert admitted(POLICIES, router, Peer("client", ip="203.0.113.9"), port)
        assert admitted(POLICIES, router, Peer("tenant pod", {}, PLAIN_NS), port)
    assert not admitted(POLICIES, router, Peer("client", ip="203.0.113.9"), 8265)
    assert not admitted(POLICIES, router, Peer("tenant pod", {}, PLAIN_NS), 9464)
    assert admitted(POLICIES, router, Peer("prometheus", {}, MONITORING), 9464)


def test_the_policy_evaluator_is_not_vacuous() -> None:
    # A pod no policy selects is open: the assertions above hold because of the policies.
    assert admitted([], {"scheduler/region": "eu-north"}, Peer("x", ip="203.0.113.7"), 6379)
    allow_all = Doc(Path("x"), {"spec": {"podSelector": {}, "ingress": [{}]}})
    assert admitted([allow_all], {"a": "b"}, Peer("x", {}, PLAIN_NS), 6379)


# --- Redis ACL ---------------------------------------------------------------------------

ACL_TEMPLATE = INFRA / "redis" / "users.acl"
# Commands no application user may run, whatever its keys.
FORBIDDEN = {"config", "config|set", "config|get", "config|rewrite", "flushall", "flushdb", "keys", "debug", "module",
             "shutdown", "acl", "acl|setuser", "acl|list", "replicaof", "slaveof", "save", "bgsave", "bgrewriteaof",
             "migrate", "restore", "monitor", "sync", "psync", "script|flush", "client|kill", "function", "failover",
             "swapdb", "move", "rename", "object", "dump", "@all", "@admin", "@dangerous", "@keyspace"}


@dataclass(frozen=True)
class AclRules:
    """One ACL user line: root rules and selectors, each (key patterns, allowed commands)."""

    flags: frozenset[str]
    selectors: tuple[tuple[frozenset[str], frozenset[str]], ...]  # root first


def _parse_acl_template() -> dict[str, AclRules]:
    users: dict[str, AclRules] = {}
    for line in ACL_TEMPLATE.read_text().splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        words = line.split()
        assert words[0] == "user", line
        name, rest = words[1], " ".join(words[2:])
        parts = [rest.split("(")[0]] + [chunk.split(")")[0] for chunk in rest.split("(")[1:]]
        selectors = []
        for part in parts:
            tokens = part.split()
            keys = frozenset(t for t in tokens if t.startswith(("~", "%")) and "~" in t)
            commands = frozenset(t[1:].lower() for t in tokens if t.startswith("+"))
            selectors.append((keys, commands))
        flags = frozenset(t for t in rest.split("(")[0].split() if t in ("on", "off", "nopass", "resetkeys"))
        users[name] = AclRules(flags, tuple(selectors))
    return users


def test_acl_users_are_the_expected_ones_and_default_is_off() -> None:
    users = _parse_acl_template()
    assert set(users) == {"default", "router", "region", "exporter", "admin"}
    assert "off" in users["default"].flags
    assert all(not commands and not keys for keys, commands in users["default"].selectors)
    assert all("nopass" not in u.flags for u in users.values())


def test_the_region_user_reaches_only_its_state_tickets_and_receipts() -> None:
    namespace = load_render().default_options().key_namespace
    rules = _parse_acl_template()["region"]
    keys = {k for keys, _ in rules.selectors for k in keys}
    prefix = f"sched:{namespace}:"
    assert keys == {f"~{prefix}region:*", f"%W~{prefix}ticket:*", f"%W~{prefix}receipts"}
    commands = {c for _, commands in rules.selectors for c in commands}
    assert commands == {"ping", "get", "set", "xadd"}
    by_keys = {k: commands for keys, commands in rules.selectors for k in keys}
    assert by_keys[f"%W~{prefix}ticket:*"] == {"set"} and by_keys[f"%W~{prefix}receipts"] == {"xadd"}
    root_keys, _ = rules.selectors[0]
    assert not root_keys, "no key pattern outside a selector"


def test_application_users_have_no_admin_commands() -> None:
    namespace = load_render().default_options().key_namespace
    for name in ("router", "region", "exporter"):
        rules = _parse_acl_template()[name]
        commands = {c for _, commands in rules.selectors for c in commands}
        assert not commands & FORBIDDEN - ({"config|get"} if name == "exporter" else set()), name
        assert not any(c.startswith("@") for c in commands), f"{name}: a whole category"
        keys = {k for keys, _ in rules.selectors for k in keys}
        assert all(k.split("~", 1)[1].startswith(f"sched:{namespace}:") for k in keys), name
    router_args = container(one("Deployment", "scheduler-router"), "router")["args"]
    assert f"--namespace={namespace}" in router_args


# The live check: the statefulset's own init script renders the template, a real Redis loads it.

REDIS_SERVER = shutil.which("redis-server")
PASSWORDS = {"ROUTER_PASSWORD": "router-pw-1", "REGION_PASSWORD": "region-pw-1",
             "EXPORTER_PASSWORD": "exporter-pw-1", "ADMIN_PASSWORD": "admin-pw-1"}


def _init_script() -> str:
    spec = one("StatefulSet", "redis").body["spec"]["template"]["spec"]
    (init,) = [c for c in spec["initContainers"] if c["name"] == "acl"]
    assert init["command"] == ["/bin/sh", "-c"]
    return str(init["args"][0])


def _render_acl(tmp: Path, env: Mapping[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["/bin/sh", "-c", _init_script()], capture_output=True, text=True, timeout=30, check=False,
                          env={"PATH": os.environ["PATH"], "ACL_TEMPLATE": str(ACL_TEMPLATE),
                               "ACL_FILE": str(tmp / "users.acl"), **env})


def test_the_init_script_refuses_a_missing_password(tmp_path: Path) -> None:
    done = _render_acl(tmp_path, {**PASSWORDS, "REGION_PASSWORD": ""})
    assert done.returncode != 0 and "region" in done.stderr
    assert not (tmp_path / "users.acl").exists()


def test_the_rendered_acl_holds_hashes_not_passwords(tmp_path: Path) -> None:
    done = _render_acl(tmp_path, {**PASSWORDS, "ROUTER_PASSWORD_PREVIOUS": "router-pw-0"})
    assert done.returncode == 0, done.stderr
    text = (tmp_path / "users.acl").read_text()
    assert not any(pw in text for pw in [*PASSWORDS.values(), "router-pw-0"])
    assert not re.search(r"@[A-Z]+@", text) and "\n#" not in text
    assert len(re.findall(r"#[0-9a-f]{64}", text)) == 5  # four users, the router with two passwords


@pytest.fixture(scope="module")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    assert REDIS_SERVER is not None, "redis-server is not installed (apt-get install redis-server)"
    tmp = tmp_path_factory.mktemp("redis-acl")
    done = _render_acl(tmp, {**PASSWORDS, "ROUTER_PASSWORD_PREVIOUS": "router-pw-0"})
    assert done.returncode == 0, done.stderr
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen([REDIS_SERVER, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                               "--appendonly", "no", "--dir", str(tmp), "--aclfile", str(tmp / "users.acl"),
                               "--logfile", str(tmp / "redis.log")])
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    log = (tmp / "redis.log").read_text() if (tmp / "redis.log").exists() else ""
                    raise AssertionError(f"redis-server did not start: {log[-2000:]}") from None
                time.sleep(0.05)
        yield f"127.0.0.1:{port}"
    finally:
        server.terminate()
        server.wait(timeout=10)


def _client(address: str, user: str | None, password: str | None) -> Any:
    import redis

    host, port = address.split(":")
    return redis.Redis(host=host, port=int(port), username=user, password=password, socket_timeout=5)


def _denied(call: Any) -> bool:
    """True when Redis refuses the call for want of rights or of a login (not for another error)."""
    import redis

    try:
        call()
    except (redis.exceptions.NoPermissionError, redis.exceptions.AuthenticationError):
        return True
    except redis.exceptions.ResponseError as exc:
        return str(exc).startswith(("NOPERM", "NOAUTH", "WRONGPASS"))
    return False


def test_the_router_store_works_as_the_router_user(redis_url: str) -> None:
    from scheduler.state import keys
    from scheduler.state.redis_store import RedisStore

    namespace = load_render().default_options().key_namespace

    async def exercise(password: str) -> None:
        store = RedisStore.from_url(f"redis://router:{password}@{redis_url}/0", namespace)
        try:
            assert await store.ping()
            await store.set(keys.FLAGS, b'{"energy_routing": true}', ttl_s=60)
            assert await store.get(keys.FLAGS) is not None
            assert await store.mget([keys.FLAGS, keys.region_state("eu-north")]) == [
                b'{"energy_routing": true}', None]
            assert keys.FLAGS in await store.keys("")
            await store.hincrbyfloat(keys.ledger("t", "2026-01"), "energy_j", 1.5)
            assert float((await store.hgetall(keys.ledger("t", "2026-01")))["energy_j"]) > 0
            assert await store.acquire_lock("poller", "me", 5)
            assert await store.acquire_lock("poller", "me", 5)  # extend: a Lua script
            await store.release_lock("poller", "me")
            await store.xadd(keys.AUDIT, {"a": "1"}, maxlen=100)
            assert await store.xrange(keys.AUDIT, count=10)
            assert await store.incr_window("rate:t", 60) >= 1
            await store.delete(keys.FLAGS)
        finally:
            await store.close()

    asyncio.run(exercise(PASSWORDS["ROUTER_PASSWORD"]))
    asyncio.run(exercise("router-pw-0"))  # the previous password still works during a rotation
    router = _client(redis_url, "router", PASSWORDS["ROUTER_PASSWORD"])
    assert _denied(lambda: router.get("outside:the:namespace"))
    assert _denied(lambda: router.keys("*"))
    assert _denied(lambda: router.config_get("*"))
    assert _denied(lambda: router.flushall())
    assert _denied(lambda: router.acl_list())


def test_the_region_user_can_publish_consume_tickets_and_write_receipts_only(redis_url: str) -> None:
    from scheduler.state import keys
    from scheduler.state.redis_store import RedisStore

    namespace = load_render().default_options().key_namespace
    prefix = f"sched:{namespace}:"

    async def exercise() -> None:
        store = RedisStore.from_url(f"redis://region:{PASSWORDS['REGION_PASSWORD']}@{redis_url}/0", namespace)
        try:
            assert await store.ping()
            await store.set(keys.region_state("eu-north"), b"{}", ttl_s=10)  # the publisher
            assert await store.get(keys.region_state("eu-north")) == b"{}"
            await store.xadd("receipts", {"receipt": "signed"}, maxlen=1000)  # direct mode
        finally:
            await store.close()

    asyncio.run(exercise())
    region = _client(redis_url, "region", PASSWORDS["REGION_PASSWORD"])
    ticket = f"{prefix}ticket:d1:eu-north:h200-long"
    assert region.set(ticket, b"1", nx=True, px=30_000) is True  # single use: first time
    assert region.set(ticket, b"1", nx=True, px=30_000) is None  # replay
    denied = {
        "read a ticket": lambda: region.get(ticket),
        "SET ... GET a ticket": lambda: region.set(ticket, b"1", get=True),
        "overwrite the receipts stream": lambda: region.set(f"{prefix}receipts", b"x"),
        "read receipts": lambda: region.xrange(f"{prefix}receipts"),
        "stream into its state keys": lambda: region.xadd(f"{prefix}region:eu-north:x", {"a": "1"}),
        "flags (kill switch)": lambda: region.set(f"{prefix}flags", b"{}"),
        "carbon signals": lambda: region.get(f"{prefix}signal:carbon:NO"),
        "the ledger": lambda: region.hincrbyfloat(f"{prefix}ledger:t:2026-01", "energy_j", 1.0),
        "the audit stream": lambda: region.xadd(f"{prefix}audit", {"a": "1"}),
        "delete": lambda: region.delete(f"{prefix}region:eu-north:state"),
        "scan": lambda: region.scan(match=f"{prefix}*"),
        "keys": lambda: region.keys("*"),
        "another namespace": lambda: region.get("sched:other:region:eu-north:state"),
        "config": lambda: region.config_get("*"),
        "flushall": lambda: region.flushall(),
        "eval": lambda: region.eval("return 1", 0),
    }
    allowed = [what for what, call in denied.items() if not _denied(call)]
    assert allowed == [], f"the region user may: {allowed}"


def test_default_user_is_off_and_the_exporter_sees_no_data(redis_url: str) -> None:
    anonymous = _client(redis_url, None, None)
    assert _denied(lambda: anonymous.ping())
    exporter = _client(redis_url, "exporter", PASSWORDS["EXPORTER_PASSWORD"])
    assert exporter.ping() and "redis_version" in exporter.info()
    assert _denied(lambda: exporter.get("sched:prod:flags"))
    assert _denied(lambda: exporter.config_set("maxmemory", "1"))
    assert _denied(lambda: _client(redis_url, "region", "wrong").ping())
    admin = _client(redis_url, "admin", PASSWORDS["ADMIN_PASSWORD"])
    assert "region" in " ".join(str(u) for u in admin.acl_users())


def test_redis_loads_the_rendered_acl_file_and_the_template_ships_in_its_configmap() -> None:
    conf = dict(line.split(None, 1) for line in (INFRA / "redis" / "redis.conf").read_text().splitlines()
                if line.strip() and not line.startswith("#"))
    spec = one("StatefulSet", "redis").body["spec"]["template"]["spec"]
    (init,) = spec["initContainers"]
    env = {e["name"]: e.get("value") for e in init["env"]}
    assert conf["aclfile"] == env["ACL_FILE"]
    redis = container(one("StatefulSet", "redis"), "redis")
    assert "--requirepass" not in " ".join(redis["command"] + redis.get("args", []))
    assert any(env["ACL_FILE"].startswith(m["mountPath"]) for m in redis["volumeMounts"])
    kustomization = yaml.safe_load((INFRA / "redis" / "kustomization.yaml").read_text())
    files = [f for g in kustomization["configMapGenerator"] if g["name"] == "redis-config" for f in g["files"]]
    assert Path(env["ACL_TEMPLATE"]).name in files
