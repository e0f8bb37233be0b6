"""``--executor ray --address``: every failure to connect ends within ``--connect-timeout`` as
one line (exit 2) — a listener that is not Ray (silent, or talking garbage), a host that drops
the connection (unroutable), a closed port, a cluster that refuses the driver (wrong version)."""

from __future__ import annotations

import contextlib
import signal
import socket
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from bastion.cli import main
from bastion.errors import ConfigError
from bastion.sim import experiments
from bastion.sim.experiments import ray_connect
from bastion.sim.results import RunStore

pytest.importorskip("ray")

TIMEOUT = 3.0
SLACK = 6.0  # process start and teardown on a loaded machine


@pytest.fixture(autouse=True)
def hard_limit() -> Iterator[None]:
    """A hang fails the test instead of stalling the suite."""

    def stop(signum: int, frame: object) -> None:
        raise TimeoutError("test exceeded its 60 s limit (the connection was not bounded)")

    old = signal.signal(signal.SIGALRM, stop)
    signal.alarm(60)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def _listener(reply: bytes | None) -> tuple[socket.socket, int]:
    """A TCP server that accepts every connection and sends ``reply`` (None: says nothing)."""
    srv = socket.socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("127.0.0.1", 0))
    srv.listen(16)
    held: list[socket.socket] = []

    def serve() -> None:
        while True:
            try:
                conn, _ = srv.accept()
            except OSError:
                return
            held.append(conn)
            if reply is not None:
                with contextlib.suppress(OSError):
                    conn.sendall(reply)

    threading.Thread(target=serve, daemon=True).start()
    return srv, int(srv.getsockname()[1])


def _dropping() -> tuple[socket.socket, list[socket.socket], int]:
    """A port whose connections are never completed (a full backlog drops the SYN): as a host
    that does not answer (unroutable, firewalled)."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(0)
    port = int(srv.getsockname()[1])
    fill = []
    for _ in range(4):
        c = socket.socket()
        c.setblocking(False)
        with contextlib.suppress(BlockingIOError):
            c.connect(("127.0.0.1", port))
        fill.append(c)
    time.sleep(0.3)
    return srv, fill, port


def _run(address: str, tmp: Path) -> float:
    runs = [experiments.make_run(policies=["chain"], requests=1, output_len=8)]
    t0 = time.monotonic()
    experiments.run_all(runs, RunStore(tmp), "ray", address=address, connect_timeout=TIMEOUT)
    return time.monotonic() - t0


@pytest.mark.parametrize("reply", [None, b"SSH-2.0-OpenSSH_9.6\r\n", b"\x00\xff garbage " * 64])
def test_a_listener_that_is_not_ray_fails_within_the_timeout(
    tmp_path: Path, reply: bytes | None
) -> None:
    srv, port = _listener(reply)
    t0 = time.monotonic()
    try:
        with pytest.raises(ConfigError, match=r"no Ray cluster answered at .* within 3 s"):
            _run(f"127.0.0.1:{port}", tmp_path)
    finally:
        srv.close()
    assert time.monotonic() - t0 < TIMEOUT + SLACK


def test_a_host_that_drops_the_connection_fails_within_the_timeout(tmp_path: Path) -> None:
    srv, fill, port = _dropping()
    t0 = time.monotonic()
    try:
        with pytest.raises(ConfigError, match=r"cannot reach a Ray cluster at .* within 3 s"):
            _run(f"127.0.0.1:{port}", tmp_path)
    finally:
        for s in (srv, *fill):
            s.close()
    elapsed = time.monotonic() - t0
    assert TIMEOUT - 0.5 < elapsed < TIMEOUT + SLACK  # it waited for the deadline, no longer


def test_a_cluster_that_refuses_the_driver_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As Ray refuses a driver of another version: the probe's last line is the message."""
    srv, port = _listener(None)
    refusal = (
        "import sys; print('Traceback (most recent call last):\\n  File x', file=sys.stderr); "
        "print('RuntimeError: Version mismatch: the cluster runs Ray 2.9.3, this driver 2.60.0',"
        " file=sys.stderr); sys.exit(1)"
    )
    monkeypatch.setattr(ray_connect, "PROBE", refusal)
    try:
        with pytest.raises(ConfigError) as info:
            _run(f"127.0.0.1:{port}", tmp_path)
    finally:
        srv.close()
    assert str(info.value) == (
        f"Ray could not connect to 127.0.0.1:{port}: RuntimeError: Version mismatch: the "
        "cluster runs Ray 2.9.3, this driver 2.60.0"
    )


def test_cli_exits_2_with_one_line_for_a_silent_listener(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "exp.toml"
    config.write_text(
        textwrap.dedent(
            """
            name = "tiny"
            [grid]
            policies = ["chain"]
            requests = 1
            output_len = 8
            """
        )
    )
    srv, port = _listener(None)
    argv = ["experiment", "--config", str(config), "--out", str(tmp_path / "out")]
    argv += ["--executor", "ray", "--address", f"127.0.0.1:{port}", "--connect-timeout", "3"]
    t0 = time.monotonic()
    try:
        assert main(argv) == 2
    finally:
        srv.close()
    assert time.monotonic() - t0 < TIMEOUT + SLACK
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("bastion: error: no Ray cluster answered"), err


@pytest.mark.parametrize("value", ["0", "-1", "nan", "inf"])
def test_connect_timeout_must_be_a_finite_positive_number(
    tmp_path: Path, value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["experiment", "moe", "--quick", "--out", str(tmp_path), "--executor", "ray"]
    assert main([*argv, "--address", "127.0.0.1:1", "--connect-timeout", value]) == 2
    assert "--connect-timeout must be a finite number > 0" in capsys.readouterr().err
