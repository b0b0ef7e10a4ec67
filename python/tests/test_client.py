"""tern_client against a real `tern serve` (conftest.py): real HTTPS, real SQLite, real
child transfers between real directories. No mocks."""

from __future__ import annotations

import filecmp
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import Service

from tern_client import NetworkError, TernError, TransferAPIError, TransferClient, TransferData

WAIT_S = 120  # bound on any one job; they take well under a second here


def make_tree(root: Path) -> dict[str, bytes]:
    """A small tree with a nested directory, an empty file and a multi-chunk file."""
    files = {
        "a.bin": os.urandom(3 * 1024 * 1024 + 17),
        "empty": b"",
        "sub/dir/b.txt": b"hello\n",
        "name with spaces.dat": os.urandom(4096),
        "scratch.tmp": b"not wanted",
    }
    for rel, data in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)
    return files


def same_tree(a: Path, b: Path) -> bool:
    cmp = filecmp.dircmp(a, b)
    if cmp.left_only or cmp.right_only or cmp.funny_files:
        return False
    _, mismatch, errors = filecmp.cmpfiles(a, b, cmp.common_files, shallow=False)
    return not mismatch and not errors and all(same_tree(a / d, b / d) for d in cmp.common_dirs)


def test_copy_job_lands_byte_identical(tc: TransferClient, tmp_path: Path) -> None:
    src, dst = tmp_path / "src", tmp_path / "dst"
    make_tree(src)
    tdata = TransferData(None, None, label="pytest copy").add_item(str(src), str(dst), recursive=True)
    job = tc.submit_transfer(tdata)
    assert job["state"] in ("queued", "running") and job["task_id"] == job["id"]
    assert tc.task_wait(job["id"], timeout=WAIT_S, polling_interval=1)
    done = tc.get_task(job["id"])
    assert done["state"] == "succeeded", done
    assert done["summary"]["files"] == 5 and done["summary"]["files_failed"] == 0
    assert done["spec"]["label"] == "pytest copy"
    assert same_tree(src, dst)


def test_sync_with_filter_rule_and_endpoint_prefix(tc: TransferClient, tmp_path: Path) -> None:
    src, dst = tmp_path / "src", tmp_path / "dst"
    make_tree(src)
    # Endpoint "/" + relative item paths: joined as the service's local paths.
    tdata = TransferData(str(tmp_path) + "/", str(tmp_path) + "/", sync_level="checksum").add_filter_rule("*.tmp")
    tdata.add_item("src", "dst")
    job = tc.wait(tc.submit_transfer(tdata)["id"], timeout=WAIT_S)
    assert job["state"] == "succeeded", job
    assert job["spec"]["sync"] is True and job["spec"]["options"] == {"checksum": True, "filters": ["- *.tmp"]}
    assert not (dst / "scratch.tmp").exists()
    (src / "scratch.tmp").unlink()
    assert same_tree(src, dst)


def test_several_items_are_one_job_each(tc: TransferClient, tmp_path: Path) -> None:
    for n in ("x", "y"):
        (tmp_path / n).write_bytes(n.encode() * 1000)
    tdata = TransferData().add_item(str(tmp_path / "x"), str(tmp_path / "x2")).add_item(str(tmp_path / "y"), str(tmp_path / "y2"))
    with pytest.raises(ValueError, match="submit_transfer_items"):
        tc.submit_transfer(tdata)
    jobs = tc.submit_transfer_items(tdata)
    assert len(jobs) == 2 and jobs[0]["id"] < jobs[1]["id"]
    for j in jobs:
        assert tc.wait(j["id"], timeout=WAIT_S)["state"] == "succeeded"
    assert (tmp_path / "x2").read_bytes() == b"x" * 1000 and (tmp_path / "y2").read_bytes() == b"y" * 1000


def silent_daemon() -> socket.socket:
    """A "daemon" that accepts connections and never answers: a job's child hangs in its
    handshake, so the job is reliably running until it is canceled."""
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)
    return silent


def hanging_job(tc: TransferClient, service: Service, silent: socket.socket, tmp_path: Path) -> dict[str, Any]:
    """Submits a job to the silent daemon and returns it once it runs."""
    (tmp_path / "f").write_bytes(b"data")
    daemon = f"tern://127.0.0.1:{silent.getsockname()[1]}"
    tdata = TransferData(None, daemon, token_file=str(service.daemon_token)).add_item(str(tmp_path / "f"), "/incoming")
    assert tdata.specs()[0]["dst"] == daemon + "/incoming"
    job = tc.submit_transfer(tdata)
    wait_for_state(tc, job["id"], "running")
    return job


def wait_for_state(tc: TransferClient, job_id: int, state: str) -> None:
    deadline = time.monotonic() + 30
    while tc.get_task(job_id)["state"] != state:
        assert time.monotonic() < deadline, tc.get_task(job_id)
        time.sleep(0.05)


def test_cancel_a_running_job_then_retry_it(service: Service, tc: TransferClient, tmp_path: Path) -> None:
    silent = silent_daemon()
    try:
        job = hanging_job(tc, service, silent, tmp_path)
        canceled = tc.cancel_task(job["id"])
        assert canceled["state"] == "canceled"
        assert tc.task_wait(job["id"], timeout=5)
        assert tc.get_task(job["id"])["state"] == "canceled"
        # Canceling again does not fit the state: 409, said so.
        with pytest.raises(TransferAPIError) as e:
            tc.cancel_task(job["id"])
        assert (e.value.http_status, e.value.code) == (409, "Conflict")
        assert "only queued, retrying or running" in e.value.message
        # A canceled job can be queued again, and canceled again.
        assert tc.retry_task(job["id"])["state"] in ("queued", "running")
        assert tc.cancel_task(job["id"])["state"] == "canceled"
        assert job["id"] in [j["id"] for j in tc.task_list(state="canceled")]
    finally:
        silent.close()


def test_task_list_is_newest_first_and_filters_by_state(tc: TransferClient, tmp_path: Path) -> None:
    (tmp_path / "f").write_bytes(b"1")
    ids = [tc.submit_transfer(TransferData().add_item(str(tmp_path / "f"), str(tmp_path / f"g{i}")))["id"] for i in range(3)]
    for i in ids:
        assert tc.task_wait(i, timeout=WAIT_S)
    listed = [j["id"] for j in tc.task_list(limit=1000)]
    assert listed == sorted(listed, reverse=True)
    assert set(ids) <= set(listed)
    assert [j["id"] for j in tc.task_list(limit=2)] == listed[:2]
    ok = tc.task_list(state="succeeded")
    assert ok and all(j["state"] == "succeeded" for j in ok) and set(ids) <= {j["id"] for j in ok}
    with pytest.raises(TransferAPIError) as e:
        tc.task_list(state="done")
    assert e.value.http_status == 400 and "not one of" in e.value.message


def test_errors_carry_status_code_and_message(service: Service, tc: TransferClient) -> None:
    with pytest.raises(TransferAPIError) as e:
        tc.get_task(999999)
    assert (e.value.http_status, e.value.code) == (404, "ClientError.NotFound")
    with pytest.raises(TransferAPIError) as e:
        tc.submit_transfer(TransferData().add_item("relative/path", "/tmp/x"))
    assert e.value.http_status == 400 and "relative" in e.value.message
    with pytest.raises(TransferAPIError) as e:
        tc.submit_transfer(TransferData(no_such_option=1).add_item("/tmp/a", "/tmp/b"))
    assert e.value.http_status == 422 and "no_such_option" in e.value.message
    # A hostile id cannot reach another route.
    with pytest.raises(TransferAPIError) as e:
        tc.get_task("1/cancel")
    assert e.value.http_status in (400, 404)


@pytest.mark.parametrize(
    "token, says",
    [
        ("tern_" + "0" * 16 + "_" + "0" * 64, "unknown token"),
        ("not-a-token", "malformed token"),
    ],
)
def test_bad_token_is_401(service: Service, token: str, says: str) -> None:
    with pytest.raises(TransferAPIError) as e:
        service.client(token).task_list()
    assert (e.value.http_status, e.value.code) == (401, "AuthenticationFailed")
    assert says in e.value.message


def test_tokens_create_list_scope_and_revoke(service: Service, admin: TransferClient, tmp_path: Path) -> None:
    new = admin.create_token("read", name="pytest reader", expires="1h")
    assert new["scope"] == "read" and new["token"].startswith("tern_")
    listed = {t["id"]: t for t in admin.list_tokens()}
    assert listed[new["id"]]["name"] == "pytest reader"
    assert all("token" not in t and "hash" not in t for t in listed.values())
    reader = service.client(new["token"])
    assert reader.whoami()["id"] == new["id"]
    reader.task_list(limit=1)
    # Read scope: may look, may not submit, may not make tokens.
    with pytest.raises(TransferAPIError) as e:
        reader.submit_transfer(TransferData().add_item(str(tmp_path), str(tmp_path / "x")))
    assert (e.value.http_status, e.value.code) == (403, "PermissionDenied")
    with pytest.raises(TransferAPIError) as e:
        reader.create_token("read")
    assert e.value.http_status == 403
    assert admin.revoke_token(new["id"]) == {"revoked": new["id"]}
    with pytest.raises(TransferAPIError) as e:
        reader.task_list()
    assert e.value.http_status == 401 and "revoked" in e.value.message
    # The last admin token cannot be revoked.
    with pytest.raises(TransferAPIError) as e:
        admin.revoke_token(admin.whoami()["id"])
    assert e.value.http_status == 409


def test_path_prefix_token_is_confined(service: Service, admin: TransferClient, tmp_path: Path) -> None:
    mine = tmp_path / "alice"
    mine.mkdir()
    alice = service.client(admin.create_token("transfer", path_prefix=str(mine), expires="1h")["token"])
    for src, dst in [("/etc/passwd", str(mine / "p")), (str(mine / "a"), str(tmp_path / "out")), (str(mine) + "/../x", str(mine / "y"))]:
        with pytest.raises(TransferAPIError) as e:
            alice.submit_transfer(TransferData().add_item(src, dst))
        assert e.value.http_status in (400, 403), (src, dst)
    assert alice.task_list() == []  # sees only its own jobs


def test_tls_is_checked_and_plain_http_refused(service: Service) -> None:
    # Without the service's certificate, the system CAs do not trust it: no request is sent.
    with pytest.raises(NetworkError, match="certificate"):
        TransferClient(service.url, token=service.admin_token).task_list()
    with pytest.raises(TernError, match="https://"):
        TransferClient(service.url.replace("https://", "http://"), token=service.admin_token)
    # Token from a file, as `tern --token @FILE`.
    c = TransferClient(service.url, token="@" + str(service.state / "admin.token"), ca_cert=service.ca)
    assert c.whoami()["scope"] == "admin"


def test_a_token_file_others_can_read_is_warned_about(service: Service, tmp_path: Path) -> None:
    loose = tmp_path / "token"
    loose.write_text(service.admin_token + "\n")
    loose.chmod(0o644)
    with pytest.warns(UserWarning, match="readable by others.*chmod 600"):
        c = TransferClient(service.url, token=f"@{loose}", ca_cert=service.ca)
    assert c.whoami()["scope"] == "admin"  # used all the same: the warning says what to do


def test_stage_in_example_runs_the_next_step(service: Service, tc: TransferClient, tmp_path: Path) -> None:
    src, dst = tmp_path / "in", tmp_path / "staged"
    make_tree(src)
    example = Path(__file__).resolve().parents[1] / "examples" / "stage_in.py"
    env = dict(os.environ, TERN_SERVER=service.url, TERN_TOKEN=tc._token, TERN_CA_FILE=service.ca)
    step = [sys.executable, "-c", "import sys, os; sys.exit(0 if os.path.isfile(sys.argv[1]) else 9)", str(dst / "a.bin")]
    out = subprocess.run(
        [sys.executable, str(example), str(src), str(dst), "--timeout", str(WAIT_S), "--", *step], env=env, capture_output=True, text=True, timeout=WAIT_S + 30
    )
    assert out.returncode == 0, out.stderr
    assert "succeeded" in out.stderr and same_tree(src, dst)
    # A missing source fails the job: status 1 and the next step does not run.
    out = subprocess.run(
        [sys.executable, str(example), str(tmp_path / "missing"), str(tmp_path / "nowhere"), "--", "false"],
        env=env,
        capture_output=True,
        text=True,
        timeout=WAIT_S + 30,
    )
    assert out.returncode == 1, out.stderr
    assert "failed" in out.stderr
    # A refused request: status 2.
    out = subprocess.run([sys.executable, str(example), "relative", str(dst), "--", "false"], env=env, capture_output=True, text=True, timeout=WAIT_S + 30)
    assert out.returncode == 2 and "relative" in out.stderr


def test_sync_level_exists_tops_up_and_delete_removes_extras(tc: TransferClient, tmp_path: Path) -> None:
    src, dst = tmp_path / "src", tmp_path / "dst"
    src.mkdir()
    dst.mkdir()
    (src / "keep").write_bytes(b"new content")
    (src / "new").write_bytes(b"n")
    (dst / "keep").write_bytes(b"old")
    (dst / "extra").write_bytes(b"x")
    tdata = TransferData(sync_level="exists", delete_destination_extra=True).add_item(str(src), str(dst))
    job = tc.wait(tc.submit_transfer(tdata)["id"], timeout=WAIT_S)
    assert job["state"] == "succeeded", job
    assert job["spec"]["options"] == {"ignore_existing": True, "delete": True}
    assert (dst / "keep").read_bytes() == b"old" and (dst / "new").read_bytes() == b"n"
    assert not (dst / "extra").exists()


def test_transfer_data_refuses_what_tern_cannot_do() -> None:
    with pytest.raises(ValueError, match="sync_level"):
        TransferData(sync_level="sometimes")
    with pytest.raises(ValueError, match="needs a sync_level"):
        TransferData(delete_destination_extra=True)
    with pytest.raises(ValueError, match="no items"):
        TransferData().specs()
    with pytest.raises(ValueError, match="exclude"):
        TransferData().add_filter_rule("x", method="drop")


def test_wait_rides_over_a_service_restart(tmp_path: Path) -> None:
    s = Service(tmp_path / "svc")
    silent = silent_daemon()
    try:
        tc = s.client(s.admin_token)
        job = hanging_job(tc, s, silent, tmp_path)
        seen: dict[str, Any] = {}
        waiter = threading.Thread(target=lambda: seen.update(job=tc.wait(job["id"], timeout=WAIT_S)))
        waiter.start()
        time.sleep(0.3)  # lets the long poll be in flight when the service dies (not a check)
        s.restart()  # kill -9: the long poll's connection drops; the waiter retries
        # The restarted service queued the interrupted job again and runs it again.
        wait_for_state(tc, job["id"], "running")
        assert waiter.is_alive()
        tc.cancel_task(job["id"])
        waiter.join(WAIT_S)
        assert seen["job"]["state"] == "canceled"
    finally:
        silent.close()
        s.stop()
