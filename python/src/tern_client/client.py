"""``TransferClient``: the tern service's REST API (docs/openapi.json) over HTTPS.

Standard library only: ``urllib.request`` with an ``ssl`` context. One request per call, no
background threads, nothing cached but the connection settings.
"""

from __future__ import annotations

import http.client
import json
import math
import os
import ssl
import time
import urllib.error
import urllib.parse
import urllib.request
import warnings
from typing import Any, Union

from .data import TransferData
from .errors import NetworkError, TernError, TransferAPIError

JobId = Union[int, str]

# The longest long poll the service holds (60 s) plus a slow network, as the tern CLI uses.
_TIMEOUT_S = 75.0
_MAX_LONG_POLL_S = 60
# task_wait rides over a service restart for this long, as `tern wait` does.
_RECONNECT_S = 20.0
TERMINAL_STATES = ("succeeded", "failed", "canceled")


def _read_token(token: str | None) -> str:
    if token is None:
        token = os.environ.get("TERN_TOKEN")
    if not token:
        raise TernError("no token given: pass token=... or set TERN_TOKEN (tern token create prints one)")
    if token.startswith("@"):
        path = token[1:]
        with open(path, encoding="utf-8") as f:
            mode = os.fstat(f.fileno()).st_mode & 0o777
            token = f.read()
        if mode & 0o077:
            # ssh and rsyncd refuse such files; a client that cannot know the file's history warns.
            warnings.warn(f"token file {path} is readable by others (mode {mode:04o}); anyone who reads it can act as you: chmod 600 {path}", stacklevel=3)
    return token.strip()


def _ssl_context(ca_cert: str | None, verify: bool | str) -> ssl.SSLContext:
    if isinstance(verify, str):
        ca_cert = ca_cert or verify
    if verify is False:
        # Encrypted but unauthenticated: anyone on the path can read the token. Tests only.
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        return ctx
    if ca_cert:
        if not os.path.isfile(ca_cert):
            raise TernError(f"CA file {ca_cert} does not exist; it is the service's STATE_DIR/tls/cert.pem (or your site's CA bundle)")
        return ssl.create_default_context(cafile=ca_cert)
    return ssl.create_default_context()


class TransferClient:
    """A client of one tern service.

    Args:
        base_url: the service, ``https://HOST:PORT`` (default: ``$TERN_SERVER``).
        token: an API token (``tern_<id>_<secret>``) or ``@FILE`` holding one
            (default: ``$TERN_TOKEN``).
        ca_cert: PEM certificate(s) to trust: the service's ``STATE_DIR/tls/cert.pem`` when it
            uses its self-signed one (default: ``$TERN_CA_FILE``, else the system's CAs).
        verify: ``True`` (default) checks the certificate; a path is taken as ``ca_cert``
            (as in ``requests``); ``False`` skips the check (never outside tests).
        timeout: seconds for one request to answer (long polls add their own time).
    """

    def __init__(
        self,
        base_url: str | None = None,
        *,
        token: str | None = None,
        ca_cert: str | None = None,
        verify: bool | str = True,
        timeout: float = _TIMEOUT_S,
    ) -> None:
        base_url = base_url or os.environ.get("TERN_SERVER")
        if not base_url:
            raise TernError("no service given: pass base_url='https://HOST:PORT' or set TERN_SERVER")
        if not base_url.startswith("https://"):
            raise TernError(f"service '{base_url}' must be an https:// URL (e.g. https://dtn1:7443); the API is only served over TLS")
        self.base_url = base_url.rstrip("/")
        self._token = _read_token(token)
        if ca_cert is None and verify is True:
            ca_cert = os.environ.get("TERN_CA_FILE") or None
        self._ssl = _ssl_context(ca_cert, verify)
        self.timeout = timeout

    def __repr__(self) -> str:
        return f"TransferClient({self.base_url!r})"

    # ---------- transport ----------

    def request(self, method: str, path: str, body: Any = None, *, query: dict[str, Any] | None = None, timeout: float | None = None) -> Any:
        """One API call; the decoded JSON answer (a ``str`` for non-JSON ones, e.g. /metrics).

        Raises :class:`TransferAPIError` for an error status, :class:`NetworkError` when no
        answer came.
        """
        url = self.base_url + path
        if query:
            url += "?" + urllib.parse.urlencode({k: v for k, v in query.items() if v is not None})
        headers = {"Authorization": f"Bearer {self._token}", "Accept": "application/json"}
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        req = urllib.request.Request(url, data=data, headers=headers, method=method)
        try:
            with urllib.request.urlopen(req, context=self._ssl, timeout=timeout or self.timeout) as resp:
                status, raw = resp.status, resp.read()
        except urllib.error.HTTPError as e:
            status, raw = e.code, e.read()
            e.close()
        except (urllib.error.URLError, OSError, http.client.HTTPException) as e:
            reason = getattr(e, "reason", e)
            hint = (
                "check the certificate: pass ca_cert= or set TERN_CA_FILE"
                if isinstance(reason, ssl.SSLError)
                else "check base_url / TERN_SERVER and that the service runs"
            )
            raise NetworkError(f"cannot reach {self.base_url}: {reason} ({hint})", e) from e
        text = raw.decode("utf-8", "replace")
        try:
            value: Any = json.loads(text) if text else None
        except ValueError:
            value = text
        if 200 <= status < 300:
            return value
        raise TransferAPIError.from_response(status, value)

    # ---------- jobs ----------

    def submit_transfer(self, data: TransferData) -> dict[str, Any]:
        """Submits a transfer of one item; returns the new job (``job["id"]``, also as
        ``job["task_id"]``), usually ``queued``.

        A tern job has one source and one destination: use :meth:`submit_transfer_items` for
        a ``TransferData`` with several items.
        """
        specs = data.specs()
        if len(specs) != 1:
            raise ValueError(f"a tern job copies one item and this TransferData has {len(specs)}; use submit_transfer_items(data) for one job per item")
        return _job(self.request("POST", "/v1/jobs", specs[0]))

    def submit_transfer_items(self, data: TransferData) -> list[dict[str, Any]]:
        """Submits one job per item, in order; returns the jobs.

        Not atomic: if a later item is refused, the jobs before it were submitted; the
        exception's ``submitted`` attribute lists them (cancel them if all-or-nothing matters).
        """
        jobs: list[dict[str, Any]] = []
        for spec in data.specs():
            try:
                jobs.append(_job(self.request("POST", "/v1/jobs", spec)))
            except TernError as e:
                e.submitted = jobs  # type: ignore[attr-defined]
                raise
        return jobs

    def get_task(self, job_id: JobId) -> dict[str, Any]:
        """A job: ``state``, ``progress``, ``rate_bytes_per_s``, ``eta_s``, ``summary`` (with
        per-file ``errors``), ``error``."""
        return _job(self.request("GET", f"/v1/jobs/{_id(job_id)}"))

    def task_list(self, *, state: str | None = None, limit: int = 100) -> list[dict[str, Any]]:
        """Jobs, newest first (``limit`` at most 1000); ``state`` keeps only jobs in that one
        (queued, running, retrying, succeeded, failed, canceled). A token limited to a path
        prefix sees only its own jobs."""
        out = _obj(self.request("GET", "/v1/jobs", query={"state": state, "limit": limit}))
        return [_job(j) for j in out["jobs"]]

    def task_wait(self, job_id: JobId, timeout: float | None = 10, polling_interval: float = 10) -> bool:
        """Waits until the job ends (succeeded, failed or canceled) or ``timeout`` seconds
        pass (``None``: as long as it takes). Returns whether it ended; read the outcome with
        :meth:`get_task`.

        Uses the service's long poll, so it returns as soon as the job ends; ``polling_interval``
        is accepted for Globus compatibility and not needed. Connection failures (a service
        restart) are retried for 20 s.
        """
        return self.wait(job_id, timeout=timeout)["state"] in TERMINAL_STATES

    def wait(self, job_id: JobId, *, timeout: float | None = None) -> dict[str, Any]:
        """Like :meth:`task_wait`, returning the job as last seen (terminal unless ``timeout``
        passed first)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        unreachable_since: float | None = None
        while True:
            left = _MAX_LONG_POLL_S if deadline is None else deadline - time.monotonic()
            poll = max(0, min(_MAX_LONG_POLL_S, math.ceil(left)))
            try:
                job = _job(self.request("GET", f"/v1/jobs/{_id(job_id)}/wait", query={"timeout_s": poll}, timeout=poll + self.timeout))
                unreachable_since = None
            except NetworkError:
                now = time.monotonic()
                unreachable_since = unreachable_since or now
                if now - unreachable_since > _RECONNECT_S or (deadline is not None and now >= deadline):
                    raise
                time.sleep(1)
                continue
            if job["state"] in TERMINAL_STATES or (deadline is not None and time.monotonic() >= deadline):
                return job

    def cancel_task(self, job_id: JobId) -> dict[str, Any]:
        """Cancels a queued, retrying or running job (its transfer is stopped; what landed
        verified stays). Returns the job, now ``canceled``; a job already ended is a 409
        ``Conflict``."""
        return _job(self.request("POST", f"/v1/jobs/{_id(job_id)}/cancel"))

    def retry_task(self, job_id: JobId, *, deadline: str | None = None) -> dict[str, Any]:
        """Queues a failed or canceled job again (it resumes from what landed); ``deadline``
        replaces one that passed."""
        body = {"deadline": deadline} if deadline is not None else {}
        return _job(self.request("POST", f"/v1/jobs/{_id(job_id)}/retry", body))

    # ---------- tokens (admin) ----------

    def create_token(self, scope: str = "transfer", *, expires: str | None = None, name: str | None = None, path_prefix: str | None = None) -> dict[str, Any]:
        """Creates a token (``read`` < ``transfer`` < ``admin``; no more than the caller's);
        ``expires`` ``"90d"`` (default), ``"12h"``, ``"never"``; ``path_prefix`` limits its
        jobs to paths under it. The secret is in ``["token"]``, shown this once."""
        body: dict[str, Any] = {"scope": scope}
        for k, v in (("expires", expires), ("name", name), ("path_prefix", path_prefix)):
            if v is not None:
                body[k] = v
        return _obj(self.request("POST", "/v1/tokens", body))

    def list_tokens(self) -> list[dict[str, Any]]:
        """Every token's metadata (never secrets)."""
        return [_obj(t) for t in _obj(self.request("GET", "/v1/tokens"))["tokens"]]

    def revoke_token(self, token_id: str) -> dict[str, Any]:
        """Revokes a token by id (effective on its next request); the last live admin token
        cannot be revoked (409)."""
        return _obj(self.request("DELETE", f"/v1/tokens/{urllib.parse.quote(token_id, safe='')}"))

    def whoami(self) -> dict[str, Any]:
        """The calling token's metadata (id, name, scope, path prefix, expiry)."""
        return _obj(self.request("GET", "/v1/whoami"))

    def metrics(self) -> str:
        """The Prometheus text of ``/metrics``."""
        out = self.request("GET", "/metrics")
        return out if isinstance(out, str) else json.dumps(out)


def _id(job_id: JobId) -> str:
    return urllib.parse.quote(str(job_id), safe="")


def _obj(value: Any) -> dict[str, Any]:
    """The answer as a JSON object, or one line saying what came instead."""
    if not isinstance(value, dict):
        raise TernError(f"unexpected answer from the service (not a JSON object): {str(value)[:200]!r}")
    return value


def _job(value: Any) -> dict[str, Any]:
    job = _obj(value)
    # Globus SDK users read task["task_id"]; the API calls it id.
    if "id" in job:
        job.setdefault("task_id", job["id"])
    return job
