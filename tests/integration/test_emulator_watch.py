"""The Kubernetes API emulator's watch from a resourceVersion, over real HTTP (as kopf watches): like the API
server, it sends only what the client has not seen, so a reconnect of a quiet stream replays nothing
(scheduler/prfaas_testbed/k8s_emulator.py)."""

from __future__ import annotations

import json

import httpx

from prfaas_testbed.k8s_emulator import EmulatorThread

PODS = "/api/v1/namespaces/w/pods"


def pod(name: str) -> dict:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "w"}, "spec": {}}


def first_events(client: httpx.Client, params: dict[str, str], count: int) -> list[tuple[str, str]]:
    """The first ``count`` events of a watch: (type, object name)."""
    out: list[tuple[str, str]] = []
    with client.stream("GET", PODS, params={"watch": "true", **params}) as resp:
        resp.raise_for_status()
        for line in resp.iter_lines():
            if line.strip():
                event = json.loads(line)
                out.append((event["type"], event["object"]["metadata"]["name"]))
            if len(out) == count:
                break
    return out


def test_a_watch_from_a_listed_version_sends_only_what_changed_since(emu: EmulatorThread) -> None:
    with httpx.Client(base_url=emu.url, timeout=30) as client:
        for name in ("a", "b"):
            client.post(PODS, json=pod(name)).raise_for_status()
        listed = client.get(PODS).json()["metadata"]["resourceVersion"]
        client.post(PODS, json=pod("c")).raise_for_status()  # after the list
        patch = {"metadata": {"labels": {"x": "1"}}}
        headers = {"Content-Type": "application/merge-patch+json"}
        client.patch(f"{PODS}/a", json=patch, headers=headers).raise_for_status()  # changed after the list
        # without a version: every object, as before
        assert sorted(first_events(client, {}, 3)) == [("ADDED", "a"), ("ADDED", "b"), ("ADDED", "c")]
        # from the list's version: b is not sent again; a (changed) and c (new) are
        assert sorted(first_events(client, {"resourceVersion": listed}, 2)) == [("ADDED", "a"), ("ADDED", "c")]
