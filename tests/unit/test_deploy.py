"""The deployment files in ``deploy/`` stay true to the code: every flag they use exists,
the compose file and the manifests parse, no restartable unit bootstraps a router group,
each deployment places its storage processes on the ring and uses one partitioning,
and every metric (and scrape job) the alerts and the dashboard name is one that exists."""

from __future__ import annotations

import functools
import json
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
PROGRAMS = {
    ("ecast", "router"): [sys.executable, "-m", "ecast", "router", "--help"],
    ("rubberband", "storage"): [sys.executable, "-m", "rubberband.tools.cli", "storage", "--help"],
    ("rubberband", "super"): [sys.executable, "-m", "rubberband.tools.cli", "super", "--help"],
    ("rubberband", "admin"): [sys.executable, "-m", "rubberband.tools.cli", "admin", "--help"],
    ("rubberband", "views"): [sys.executable, "-m", "rubberband.tools.cli", "views", "--help"],
}
INVOCATION = re.compile(
    r"\b(ecast|rubberband)\s+(router|storage|super|admin|views)\b(.*?)(?=&&|;|\||&\s|$)", re.S
)
DAEMONS = {"router", "storage", "super"}


@functools.cache
def flags_of(program: tuple[str, str]) -> frozenset[str]:
    out = subprocess.run(PROGRAMS[program], capture_output=True, text=True, timeout=60).stdout
    return frozenset(re.findall(r"(--[a-z][a-z0-9-]*)", out))


def commands() -> list[tuple[str, str, bool]]:
    """``(where, command line, restartable)`` for every daemon command in deploy/."""
    found: list[tuple[str, str, bool]] = []
    for unit in sorted((DEPLOY / "systemd").glob("*.service")):
        text = unit.read_text()
        restart = re.search(r"^Restart=(\S+)", text, re.M)
        restartable = restart is not None and restart.group(1) != "no"
        for line in re.findall(r"^ExecStart=(.*)$", text, re.M):
            found.append((unit.name, line, restartable))
    compose = yaml.safe_load((DEPLOY / "docker" / "compose.yaml").read_text())
    for name, svc in compose["services"].items():
        restartable = str(svc.get("restart", "no")) != "no"
        found.append((f"compose {name}", " ".join(svc["command"]), restartable))
    for doc in yaml.safe_load_all((DEPLOY / "kubernetes" / "rubberband.yaml").read_text()):
        if doc["kind"] not in ("StatefulSet", "Job", "Deployment"):
            continue
        pod = doc["spec"]["template"]["spec"]
        restartable = doc["kind"] != "Job" or pod.get("restartPolicy") != "Never"
        for c in pod["containers"]:
            line = " ".join([*c.get("command", []), *c.get("args", [])])
            found.append((f"{doc['kind']} {doc['metadata']['name']}", line, restartable))
    return found


def invocations() -> list[tuple[str, tuple[str, str], list[str], bool]]:
    out = []
    for where, line, restartable in commands():
        for tool, role, rest in INVOCATION.findall(line.replace("\\\n", " ")):
            out.append((where, (tool, role), re.findall(r"(--[a-z][a-z0-9-]*)", rest), restartable))
    return out


def test_every_daemon_in_deploy_is_found() -> None:
    roles = {(w.split()[0], p[1]) for w, p, _, _ in invocations()}
    assert {p for _, p in roles} == DAEMONS | {"admin", "views"}
    assert len(invocations()) >= 15
    # Each deployment keeps views, and its maintainer asks for the engine its storage
    # processes run (a view over a table needs the engine's client operations).
    maintainers = [(w, f) for w, p, f, _ in invocations() if p == ("rubberband", "views")]
    assert len(maintainers) == 3 and all("--engine" in f for _, f in maintainers)
    engines = {
        re.search(r"--engine[ \",]+([a-z-]+)", line).group(1)
        for _, line, _ in commands()
        if " storage " in f" {line} " or "views" in line
    }
    assert engines == {"scan-log"}, engines


def test_each_deployment_keeps_its_data_and_its_ring_on_disk() -> None:
    """A whole-cluster restart needs every storage process on a durable engine whose
    directory is a volume, keeping what it holds (``--keep-data``), and every super
    recording the ring on a volume (``--keyspace-file``)."""
    for where, line, _ in commands():
        if re.search(r"\brubberband storage\b", line):
            assert "--keep-data" in line and "path=" in line, where
        if re.search(r"\brubberband super\b", line):
            assert "--keyspace-file" in line, where
    compose = yaml.safe_load((DEPLOY / "docker" / "compose.yaml").read_text())
    for name, svc in compose["services"].items():
        if name.startswith(("storage", "super")):
            (volume,) = svc["volumes"]
            assert volume.split(":")[0] in compose["volumes"], name
            mount = volume.split(":")[1]
            assert mount in " ".join(svc["command"]), name  # the daemon writes there
    for doc in yaml.safe_load_all((DEPLOY / "kubernetes" / "rubberband.yaml").read_text()):
        if doc["kind"] == "StatefulSet" and doc["metadata"]["name"] in ("rb-storage", "rb-super"):
            claims = {c["metadata"]["name"] for c in doc["spec"]["volumeClaimTemplates"]}
            (c,) = doc["spec"]["template"]["spec"]["containers"]
            mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
            assert claims and all(mounts[n] in " ".join(c["args"]) for n in claims), claims
    for unit in ("rubberband-storage@.service", "rubberband-super@.service"):
        text = (DEPLOY / "systemd" / unit).read_text()
        state = re.search(r"^StateDirectory=(\S+)", text, re.M)
        assert state and f"/var/lib/{state.group(1)}" in text, unit


def test_every_flag_used_in_deploy_exists() -> None:
    for where, program, flags, _ in invocations():
        unknown = sorted(set(flags) - flags_of(program))
        assert not unknown, f"{where}: {' '.join(program)} has no {unknown}"


def test_no_restartable_unit_bootstraps_a_router_group() -> None:
    bootstraps = []
    for where, program, flags, restartable in invocations():
        if program == ("ecast", "router") and "--join" not in flags:
            assert not restartable, f"{where} bootstraps a group and may restart"
            bootstraps.append(where)
        if program == ("ecast", "router") and "--join" in flags:
            assert "--rejoin" in flags, f"{where}: a restarted router needs --rejoin"
        if program[0] == "rubberband" and program[1] in DAEMONS and restartable:
            assert "--unique-name" in flags, f"{where}: a restart needs a fresh name"
    assert len(bootstraps) == 3  # systemd, compose, Kubernetes: one each


def test_the_files_parse() -> None:
    compose = yaml.safe_load((DEPLOY / "docker" / "compose.yaml").read_text())
    assert {"bootstrap", "router1", "super1", "storage1"} <= set(compose["services"])
    kinds = [
        d["kind"]
        for d in yaml.safe_load_all((DEPLOY / "kubernetes" / "rubberband.yaml").read_text())
    ]
    assert kinds.count("StatefulSet") == 3 and kinds.count("Service") == 3 and "Job" in kinds
    assert kinds.count("Deployment") == 1  # the views maintainer
    alerts = yaml.safe_load((DEPLOY / "prometheus" / "alerts.yaml").read_text())
    assert sum(len(g["rules"]) for g in alerts["groups"]) >= 10
    dashboard = json.loads((DEPLOY / "grafana" / "rubberband.json").read_text())
    assert dashboard["panels"]
    for unit in (DEPLOY / "systemd").glob("*.service"):
        assert shlex.split(re.search(r"^ExecStart=(.*)$", unit.read_text(), re.M).group(1))


def test_every_metric_named_in_alerts_and_dashboard_is_exported() -> None:
    source = "".join(
        p.read_text() for d in ("ecast", "rubberband") for p in (ROOT / d).rglob("*.py")
    )
    text = (DEPLOY / "prometheus" / "alerts.yaml").read_text()
    text += (DEPLOY / "grafana" / "rubberband.json").read_text()
    names = set(re.findall(r"\b((?:ecast|rubberband)_[a-z_]+)\b", text))
    assert names

    def exported(name: str) -> bool:
        if f'"{name}"' in source:
            return True
        # A histogram's series are its name plus _bucket, _sum and _count.
        base = re.sub(r"_(bucket|sum|count)$", "", name)
        return base != name and re.search(rf'histogram\(\s*"{base}"', source) is not None

    missing = sorted(n for n in names if not exported(n))
    assert not missing, missing


def _bootstrap_and_place(line: str) -> tuple[str | None, int | None]:
    partitioning = re.search(r"partitioning=(\w+)", line)
    place = re.search(r"\bplace\s+(\S+)", line)
    return (
        partitioning.group(1) if partitioning else None,
        int(place.group(1)) if place and place.group(1).isdigit() else None,
    )


def test_each_deployment_places_its_storage_processes_and_all_partition_alike() -> None:
    """A deployment that starts storage processes in standby and never places them ends
    with an empty ring: each one has a place step for as many as it starts, and every
    bootstrap uses range partitioning, as ``rubberband cluster up`` does by default."""
    found: dict[str, dict[str, Any]] = {}
    for where, line, _ in commands():
        kind = "systemd" if where.endswith(".service") else where.split()[0].lower()
        partitioning, place = _bootstrap_and_place(line)
        entry = found.setdefault(kind, {"partitioning": set(), "place": []})
        if partitioning:
            entry["partitioning"].add(partitioning)
        if "place" in line.split():
            entry["place"].append(place if place is not None else line)
    env = (DEPLOY / "systemd" / "rubberband.env").read_text()
    systemd_place = int(re.search(r"^PLACE=(\d+)$", env, re.M).group(1))
    compose = yaml.safe_load((DEPLOY / "docker" / "compose.yaml").read_text())
    compose_storage = sum(1 for n in compose["services"] if n.startswith("storage"))
    manifests = list(yaml.safe_load_all((DEPLOY / "kubernetes" / "rubberband.yaml").read_text()))
    k8s_storage = next(
        d["spec"]["replicas"]
        for d in manifests
        if d["kind"] == "StatefulSet" and d["metadata"]["name"] == "rb-storage"
    )
    assert found["compose"]["place"] == [compose_storage]
    assert found["job"]["place"] == [k8s_storage]
    assert found["systemd"]["place"] == ["/opt/rubberband/bin/rubberband admin --super ${ADMIN} "
                                         "--token-file /etc/rubberband/admin_token --timeout 900 "
                                         "place ${PLACE}"]  # fmt: skip
    assert systemd_place >= 3  # the replication factor the bootstrap sets
    partitionings = set().union(*(e["partitioning"] for e in found.values()))
    assert partitionings == {"range"}, partitionings


def test_the_process_down_alert_matches_the_shipped_scrape_jobs() -> None:
    """A storage process that stops exits at once, so only its scrape target going down
    can raise an alert; the alert names the jobs the shipped scrape config defines."""
    alerts = yaml.safe_load((DEPLOY / "prometheus" / "alerts.yaml").read_text())
    rules = [r for g in alerts["groups"] for r in g["rules"]]
    down = [r for r in rules if re.search(r"\bup\{", r["expr"]) and r["expr"].endswith("== 0")]
    assert len(down) == 1
    jobs = set(re.search(r'job=~"([^"]+)"', down[0]["expr"]).group(1).split("|"))
    scrape = yaml.safe_load((DEPLOY / "prometheus" / "scrape.yaml").read_text())
    assert jobs == {j["job_name"] for j in scrape["scrape_configs"]}
    assert not [r for r in rules if "rubberband_stopped" in r["expr"]]
