"""A real `tern serve --http-listen` per test session, as crates/tern/tests/service.rs starts
one: a data daemon and the service API on loopback, a state directory in a temporary
directory, killed by PID at the end. Both listen on port 0; the addresses are read from the
lines `tern serve` prints on stderr.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from pathlib import Path
from typing import Iterator

import pytest

from tern_client import TransferClient

REPO = Path(__file__).resolve().parents[2]
START_TIMEOUT_S = 30


def tern_bin() -> Path:
    """`TERN_BIN`, else the workspace's `target/debug/tern` (built now if cargo is here)."""
    env = os.environ.get("TERN_BIN")
    if env:
        p = Path(env)
        if not os.access(p, os.X_OK):
            pytest.fail(f"TERN_BIN={env} is not an executable file")
        return p
    target = Path(os.environ.get("CARGO_TARGET_DIR", REPO / "target"))
    p = target / "debug" / "tern"
    if not p.exists():
        cargo = shutil.which("cargo")
        if cargo is None:
            pytest.fail(f"no tern binary at {p} and no cargo to build it; set TERN_BIN or run cargo build -p tern")
        subprocess.run([cargo, "build", "-p", "tern"], cwd=REPO, check=True, timeout=1800)
    return p


class Service:
    """One running `tern serve`; its URL, CA certificate, admin token and directories."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.root = base / "root"
        self.state = base / "state"
        self.daemon_token = base / "daemon.token"
        self.root.mkdir(parents=True)
        self.url = self.start("127.0.0.1:0")
        self.ca = str(self.state / "tls" / "cert.pem")
        self.admin_token = (self.state / "admin.token").read_text().strip()

    def start(self, http_listen: str) -> str:
        """Starts `tern serve` with the API on `http_listen`; returns the API's URL."""
        cmd = [
            str(tern_bin()), "serve",
            "--listen", "127.0.0.1:0", "--http-listen", http_listen,
            "--root", str(self.root), "--token-file", str(self.daemon_token), "--state-dir", str(self.state),
            # Jobs copy between the tests' own temporary directories (all under pytest's base).
            "--job-root", str(self.base.parent), "--allow-host", "127.0.0.1",
        ]  # fmt: skip
        if os.geteuid() == 0:
            # A root service runs jobs only as mapped accounts unless the operator says otherwise.
            cmd.append("--allow-root-transfers")
        # stderr goes to a file, not a pipe: nothing has to drain it, and it is there to read
        # when a test fails.
        self.log = self.base / f"serve-{time.monotonic_ns()}.log"
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=log)
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            text = self.log.read_text(errors="replace")
            m = re.search(r"service API on (https://[0-9.]+:[0-9]+)", text)
            if m and (self.state / "admin.token").exists():
                return m.group(1)
            if self.proc.poll() is not None:
                raise RuntimeError(f"tern serve exited with {self.proc.returncode} at start:\n{text}")
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"tern serve did not print its API address within {START_TIMEOUT_S} s:\n{self.log.read_text(errors='replace')}")

    def restart(self) -> None:
        """kill -9, then the same state directory on the same API port."""
        self.stop()
        assert self.start(self.url[len("https://") :]) == self.url

    def client(self, token: str) -> TransferClient:
        return TransferClient(self.url, token=token, ca_cert=self.ca)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()  # by PID: only the process this fixture started
        self.proc.wait(timeout=30)


@pytest.fixture(scope="session")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    s = Service(tmp_path_factory.mktemp("tern-service"))
    try:
        yield s
    finally:
        s.stop()


@pytest.fixture(scope="session")
def admin(service: Service) -> TransferClient:
    return service.client(service.admin_token)


@pytest.fixture(scope="session")
def tc(service: Service, admin: TransferClient) -> TransferClient:
    """A client with a transfer-scope token, as a user or workflow would hold."""
    return service.client(admin.create_token("transfer", name="pytest", expires="1d")["token"])
