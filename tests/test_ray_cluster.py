"""The Ray executor on a multi-node cluster: a local two-node Ray cluster started by the test, a
plug-in policy and a hardware profile that exist only in the test's directory (shipped to the
workers by the executor's runtime_env), and a clear error on a wrong address."""

from __future__ import annotations

import socket
import textwrap
from pathlib import Path

import pytest

from bastion.errors import ConfigError
from bastion.sim import experiments
from bastion.sim.results import RunStore

ray = pytest.importorskip("ray")
cluster_utils = pytest.importorskip("ray.cluster_utils")

POLICY = """
from bastion.policies import FixedPolicy


class Wide:
    \"\"\"A fixed best-first tree under another name (a researcher's plug-in).\"\"\"

    def __init__(self, n=8):
        self._inner = FixedPolicy(n)
        self.name = f"wide:{n}"

    def choose(self, marginals, context):
        return self._inner.choose(marginals, context)
"""


def simulated(rows: list[dict]) -> list[dict]:  # type: ignore[type-arg]
    return [{k: v for k, v in r.items() if k != "wall_s"} for r in rows]


@pytest.mark.slow  # (CI=true or -m slow: the default run stays within 5 minutes)
def test_two_node_cluster_runs_plugins_from_the_users_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, local_ray: None
) -> None:
    user = tmp_path / "user"
    (user / "plugins").mkdir(parents=True)
    (user / "plugins" / "raypolicies.py").write_text(POLICY)
    profiles = tmp_path / "profiles"
    profiles.mkdir()
    from bastion.cost.hardware import get_profile, profile_to_toml

    text = profile_to_toml(get_profile("h100-sxm")).replace('"h100-sxm"', '"lab-gpu"', 1)
    (profiles / "lab-gpu.toml").write_text(text)
    # the cluster starts first: its nodes do not inherit the variable set below, so the workers
    # see the profile directory only through the executor's runtime_env
    cluster = cluster_utils.Cluster(
        initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False}
    )
    monkeypatch.setenv("BASTION_HWPROFILES", str(profiles))  # a profile by name, from a dir
    config = user / "exp.toml"
    config.write_text(
        textwrap.dedent(
            """
            name = "cluster"
            python_path = ["plugins"]
            [grid]
            gpu = "lab-gpu"
            policies = ["chain", "raypolicies:Wide:8", "plugins/raypolicies.py:Wide:4"]
            seed = [0, 1, 2]
            requests = 1
            output_len = 24
            """
        )
    )
    try:
        runs = experiments.load_config(config).runs()
        serial = experiments.run_all(runs, RunStore(tmp_path / "serial"), "serial")
        assert {r["policy"] for r in serial} == {"ar", "chain", "wide:8", "wide:4"}
        cluster.add_node(num_cpus=1)
        cluster.wait_for_nodes()
        assert len(cluster.list_all_nodes()) == 2
        on_ray = experiments.run_all(
            runs, RunStore(tmp_path / "ray"), "ray", workers=2, address=cluster.address
        )
    finally:
        if ray.is_initialized():
            ray.shutdown()
        cluster.shutdown()
    assert simulated(on_ray) == simulated(serial)


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])  # nothing listens once the socket is closed


@pytest.mark.parametrize("form", ["{port}", "ray://{port}"])
def test_wrong_address_fails_fast_with_a_clear_error(tmp_path: Path, form: str) -> None:
    runs = [experiments.make_run(policies=["chain"], requests=1, output_len=16)]
    address = form.format(port=f"127.0.0.1:{_closed_port()}")
    with pytest.raises(ConfigError, match=r"cannot reach a Ray cluster at .* within 5 s"):
        experiments.run_all(runs, RunStore(tmp_path), "ray", address=address, connect_timeout=5.0)
    with pytest.raises(ConfigError, match="expected HOST:PORT"):
        experiments.run_all(runs, RunStore(tmp_path), "ray", address="headnode")
