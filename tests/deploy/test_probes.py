"""The spoke DaemonSet's probes (issue 27, blocker 3): startup and liveness on /healthz,
readiness on /readyz, and a spoke whose hub is unreachable with an empty cache passes the
first two (so Kubernetes waits for it instead of restarting it) but not readiness."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from deploy.local import LocalStack, free_port
from tests.deploy.k8s_support import Obj, by_key, copy_tree, rendered
from tests.support import requires_fuse


@pytest.fixture(scope="module")
def spoke(tmp_path_factory: pytest.TempPathFactory) -> Obj:
    """The gpu-region overlay's spoke container, as rendered."""
    objects = by_key(rendered(copy_tree(tmp_path_factory.mktemp("deploy")), "gpu-region"))
    pod = objects[("DaemonSet", "strata", "strata-spoke")]["spec"]["template"]["spec"]
    (container,) = [c for c in pod["containers"] if c["name"] == "spoke"]
    assert isinstance(container, dict)
    return container


def test_startup_and_liveness_on_healthz_readiness_on_readyz(spoke: Obj) -> None:
    probes = {kind: spoke[kind]["httpGet"] for kind in ("startupProbe", "livenessProbe")}
    probes["readinessProbe"] = spoke["readinessProbe"]["httpGet"]
    assert {kind: get["path"] for kind, get in probes.items()} == {
        "startupProbe": "/healthz",
        "livenessProbe": "/healthz",
        "readinessProbe": "/readyz",
    }
    assert {get["port"] for get in probes.values()} == {"metrics"}
    # a spoke that never answers is still restarted: the startup probe gives up in time
    startup = spoke["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] <= 300


@pytest.mark.fuse
@requires_fuse
def test_a_spoke_cut_off_from_its_hub_passes_startup_and_liveness(
    spoke: Obj, tmp_path: Path
) -> None:
    """The probes' own paths, asked of a real spoke pointed at a closed port with an
    empty cache: startup and liveness answer 200, readiness 503."""
    paths = {kind: spoke[kind]["httpGet"]["path"] for kind in ("startupProbe", "livenessProbe")}
    metrics = f"127.0.0.1:{free_port()}"
    with LocalStack() as stack:
        admin = stack.start_spoke(
            f"127.0.0.1:{free_port()}",
            tmp_path / "cache",
            tmp_path / "mnt",
            "16MiB",
            extra=("--metrics", metrics),
        )
        # --metrics (where the DaemonSet's probes go) serves those paths and /metrics, no
        # token, and nothing of the admin API; the admin API still wants its token
        with httpx.Client(base_url=f"http://{metrics}", timeout=10) as client:
            assert client.get("/metrics").status_code == 200
            assert "strata_spoke_cache_used_bytes" in client.get("/metrics").text
            token = (tmp_path / "cache" / "admin.token").read_text().strip()
            for path in ("/v1/cache", "/docs", "/openapi.json"):
                answer = client.get(path, headers={"Authorization": f"Bearer {token}"})
                assert answer.status_code == 404, path
        assert httpx.get(f"{admin}/v1/cache", timeout=10).status_code == 401
        assert httpx.get(f"{admin}/metrics", timeout=10).status_code == 401  # the node's only
        with httpx.Client(base_url=f"http://{metrics}", timeout=10) as client:
            for kind, path in paths.items():
                response = client.get(path)
                assert response.status_code == 200, f"{kind} {path}: {response.text}"
            ready = client.get(spoke["readinessProbe"]["httpGet"]["path"])
            assert ready.status_code == 503, ready.text
            assert "unreachable and the cache is empty" in ready.json()["detail"]
