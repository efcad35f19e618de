"""deploy/kubernetes/: every manifest parses, validates against the Kubernetes OpenAPI schemas
(kubernetes-validate bundles them, offline), and hangs together: selectors match pod labels,
Services point at named container ports, every container has probes and resource requests,
the relay is one UDP port behind a LoadBalancer with externalTrafficPolicy: Local, transceiver
ids are StatefulSet ordinals reachable by stable DNS names, and the role command lines parse
with the real argument parsers."""

from __future__ import annotations

import argparse
import re
import shlex
from collections import Counter
from pathlib import Path
from typing import Any

import kubernetes_validate as kv
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2] / "deploy" / "kubernetes"
NAMESPACE = "appliance"
FILES = sorted(ROOT.glob("*.yaml"))


def load() -> list[dict[str, Any]]:
    docs = []
    for f in FILES:
        for doc in yaml.safe_load_all(f.read_text()):
            if doc is not None:
                doc["__file"] = f.name
                docs.append(doc)
    return docs


DOCS = load()


def strip(doc: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in doc.items() if k != "__file"}


def one(kind: str, name: str) -> dict[str, Any]:
    found = [d for d in DOCS if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(found) == 1, f"expected exactly one {kind}/{name}, found {len(found)}"
    return found[0]


def containers(workload: dict[str, Any]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = workload["spec"]["template"]["spec"]["containers"]
    return out


def command_line(container: dict[str, Any]) -> list[str]:
    argv = [*container.get("command", []), *container.get("args", [])]
    if argv[:2] == ["/bin/sh", "-c"]:
        argv = shlex.split(argv[2])
        assert argv[0] == "exec"
        argv = argv[1:]
    return argv


def test_manifests_exist() -> None:
    assert FILES, f"no manifests in {ROOT}"
    assert DOCS


@pytest.mark.parametrize("doc", DOCS, ids=lambda d: f"{d['__file']}:{d['kind']}/{d['metadata']['name']}")
def test_schema(doc: dict[str, Any]) -> None:
    kv.validate(strip(doc), kv.latest_version(), strict=True)


def test_structure() -> None:
    names = Counter((d["kind"], d["metadata"]["name"]) for d in DOCS)
    assert all(n == 1 for n in names.values()), names
    for d in DOCS:
        assert d.get("apiVersion") and d.get("kind") and d["metadata"].get("name"), d["__file"]
        if d["kind"] != "Namespace":
            assert d["metadata"].get("namespace") == NAMESPACE, (d["kind"], d["metadata"])


WORKLOADS = [d for d in DOCS if d["kind"] in ("Deployment", "StatefulSet")]


@pytest.mark.parametrize("w", WORKLOADS, ids=lambda d: f"{d['kind']}/{d['metadata']['name']}")
def test_workload_probes_resources_security(w: dict[str, Any]) -> None:
    spec = w["spec"]
    labels = spec["template"]["metadata"]["labels"]
    assert spec["selector"]["matchLabels"].items() <= labels.items()
    pod = spec["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    for c in containers(w):
        assert "readinessProbe" in c and "livenessProbe" in c, c["name"]
        requests = c["resources"]["requests"]
        assert {"cpu", "memory"} <= requests.keys(), c["name"]
        assert c["resources"]["limits"]["memory"], c["name"]
        assert c["securityContext"]["allowPrivilegeEscalation"] is False
        port_names = {p["name"] for p in c.get("ports", [])}
        for probe in ("readinessProbe", "livenessProbe"):
            for kind in ("tcpSocket", "httpGet"):
                if kind in c[probe] and isinstance(c[probe][kind]["port"], str):
                    assert c[probe][kind]["port"] in port_names
        for m in c.get("volumeMounts", []):
            assert m["name"] in {v["name"] for v in pod.get("volumes", [])}


def pods_for(selector: dict[str, str]) -> list[dict[str, Any]]:
    return [w for w in WORKLOADS
            if selector.items() <= w["spec"]["template"]["metadata"]["labels"].items()]


@pytest.mark.parametrize("svc", [d for d in DOCS if d["kind"] == "Service"],
                         ids=lambda d: d["metadata"]["name"])
def test_services_select_workloads_and_named_ports(svc: dict[str, Any]) -> None:
    targets = pods_for(svc["spec"]["selector"])
    assert len(targets) == 1, f"Service {svc['metadata']['name']} selects {len(targets)} workloads"
    ports = {(p["name"], p["protocol"]) for c in containers(targets[0]) for p in c["ports"]}
    for p in svc["spec"]["ports"]:
        assert (p["targetPort"], p["protocol"]) in ports, p


def test_pdbs_cover_every_role() -> None:
    pdbs = [d for d in DOCS if d["kind"] == "PodDisruptionBudget"]
    covered = {w["metadata"]["name"] for p in pdbs for w in pods_for(p["spec"]["selector"]["matchLabels"])}
    assert {"relay", "transceiver", "signaling"} <= covered


def test_relay_public_surface() -> None:
    svc = one("Service", "relay")
    assert svc["spec"]["type"] == "LoadBalancer"
    assert svc["spec"]["externalTrafficPolicy"] == "Local"
    assert [(p["port"], p["protocol"]) for p in svc["spec"]["ports"]] == [(3478, "UDP")]
    # Nothing else is exposed outside the cluster except through the Ingress.
    for other in DOCS:
        if other["kind"] == "Service" and other is not svc:
            assert other["spec"].get("type", "ClusterIP") == "ClusterIP", other["metadata"]["name"]
    hpa = one("HorizontalPodAutoscaler", "relay")
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment",
                                             "name": "relay"}
    assert [m["resource"]["name"] for m in hpa["spec"]["metrics"]] == ["cpu"]
    assert hpa["spec"]["minReplicas"] >= 2


def test_ingress_routes_to_signaling() -> None:
    ing = one("Ingress", "signaling")
    backends = [p["backend"]["service"] for r in ing["spec"]["rules"] for p in r["http"]["paths"]]
    svc = one("Service", "signaling")
    for b in backends:
        assert b["name"] == "signaling"
        assert b["port"]["name"] in {p["name"] for p in svc["spec"]["ports"]}
    assert ing["spec"]["tls"], "browsers need HTTPS for the microphone"


def test_secret_has_routing_secret_and_is_mounted() -> None:
    secret = one("Secret", "appliance-secrets")
    assert "routing.secret" in secret["stringData"]
    for name in ("relay", "transceiver"):
        w = [d for d in WORKLOADS if d["metadata"]["name"] == name][0]
        vols = [v for v in w["spec"]["template"]["spec"]["volumes"] if "secret" in v]
        assert vols and vols[0]["secret"]["secretName"] == "appliance-secrets"
        argv = command_line(containers(w)[0])
        mount = next(m["mountPath"] for m in containers(w)[0]["volumeMounts"]
                     if m["name"] == vols[0]["name"])
        assert any(a.endswith(f"{mount}/routing.secret") for a in argv), argv


def test_transceiver_ids_are_statefulset_ordinals() -> None:
    sts = one("StatefulSet", "transceiver")
    headless = one("Service", sts["spec"]["serviceName"])
    assert headless["spec"]["clusterIP"] == "None"
    replicas = sts["spec"]["replicas"]
    argv = command_line(containers(sts)[0])
    assert argv[argv.index("--id") + 1] == "${HOSTNAME##*-}"
    dns = re.compile(rf"^(\d+)=transceiver-(\d+)\.{headless['metadata']['name']}\."
                     rf"{NAMESPACE}\.svc\.cluster\.local:(\d+)$")
    media = {p["containerPort"] for p in containers(sts)[0]["ports"] if p["name"] == "media"}
    control = {p["containerPort"] for p in containers(sts)[0]["ports"] if p["name"] == "control"}
    # Signaling lists the control addresses: exactly the ordinals 0..replicas-1.
    w = one("Deployment", "signaling")
    flag = "--transceiver-control="
    ids = []
    for e in [a[len(flag):] for a in command_line(containers(w)[0]) if a.startswith(flag)]:
        m = dns.match(e)
        assert m and m[1] == m[2] and int(m[3]) in control, e
        ids.append(int(m[1]))
    assert sorted(ids) == list(range(replicas)), (ids, replicas)
    # The relays derive the media address from the id: the pattern names every pod.
    from appliance.relay.server import pattern_address

    flag = "--transceiver-pattern="
    relay_argv = command_line(containers(one("Deployment", "relay"))[0])
    (pattern,) = [a[len(flag):] for a in relay_argv if a.startswith(flag)]
    assert not any(a.startswith("--transceiver=") for a in relay_argv)
    for k in range(replicas + 3):  # scaling up needs no relay change
        host, port = pattern_address(pattern, k)
        m = dns.match(f"{k}={host}:{port}")
        assert m and m[1] == m[2] and int(m[3]) in media, (pattern, k)


def parse(add_arguments: Any, argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(exit_on_error=False)
    add_arguments(parser)
    return parser.parse_args(argv)


def test_role_command_lines_parse(tmp_path: Path) -> None:
    from appliance.relay import cli as relay_cli
    from appliance.transceiver import cli as transceiver_cli

    secret = tmp_path / "routing.secret"
    secret.write_text("00" * 32 + "\n")
    relay = command_line(containers(one("Deployment", "relay"))[0])
    assert relay[:2] == ["appliance", "relay"]
    relay = [f"--secret-file={secret}" if a.startswith("--secret-file=") else a for a in relay]
    from appliance.config import load_config, resolve

    args = parse(relay_cli.add_arguments, relay[2:])
    resolve(args, load_config(args.config), "relay", relay_cli.DEFAULTS)
    config = relay_cli.build_config(args)
    assert config.cluster == 0 and not config.transceivers
    assert config.transceiver_pattern and config.transceiver_count is None
    assert config.redis_url == "redis://redis.appliance.svc.cluster.local:6379/0"
    assert args.nice == "0"  # non-root, no CAP_SYS_NICE: the pod's CPU request weighs it

    tx = command_line(containers(one("StatefulSet", "transceiver"))[0])
    assert tx[:2] == ["appliance", "transceiver"]
    argv = [("3" if a == "${HOSTNAME##*-}" else a) for a in tx[2:]]
    args = parse(transceiver_cli.add_arguments, argv)
    assert args.id == 3
    assert args.nice == "0"


def test_transceiver_drains_on_sigterm_within_the_grace_period() -> None:
    """Rolling upgrades keep calls: SIGTERM drains and the process exits when the last call
    ends, and the drain grace ends the stragglers cleanly before the kubelet's SIGKILL."""
    from appliance.transceiver import cli as transceiver_cli

    sts = one("StatefulSet", "transceiver")
    c = containers(sts)[0]
    argv = [("3" if a == "${HOSTNAME##*-}" else a) for a in command_line(c)[2:]]
    args = parse(transceiver_cli.add_arguments, argv)
    assert args.drain_on_sigterm and args.exit_when_drained
    grace = sts["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    assert 0 < args.drain_grace < grace - 30, (args.drain_grace, grace)
    # SIGTERM comes right away (no preStop hook holding it back), and readiness drops while
    # draining so signaling stops choosing the pod.
    assert "preStop" not in c.get("lifecycle", {})
    assert "draining" in " ".join(c["readinessProbe"]["exec"]["command"])
    assert sts["spec"]["updateStrategy"]["type"] == "RollingUpdate"
    pdb = one("PodDisruptionBudget", "transceiver")
    assert pdb["spec"]["maxUnavailable"] == 1


def test_schema_validation_catches_mistakes() -> None:
    """The schema check is real: a misspelt field and a wrong type are rejected."""
    svc = strip(one("Service", "relay"))
    bad = {**svc, "spec": {**svc["spec"], "externalTrafficPolicy": "Local", "typo": 1}}
    with pytest.raises(kv.ValidationError):
        kv.validate(bad, kv.latest_version(), strict=True)
    bad = {**svc, "spec": {**svc["spec"], "ports": [{"port": "not-a-number"}]}}
    with pytest.raises(kv.ValidationError):
        kv.validate(bad, kv.latest_version(), strict=True)
