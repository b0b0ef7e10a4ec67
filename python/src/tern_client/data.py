"""``TransferData``: what to copy, built the way a Globus SDK user builds a transfer."""

from __future__ import annotations

from typing import Any

# Globus' sync_level names; any of them makes the job a `tern sync` (only what differs is
# sent). tern compares size and mtime ("size" and "mtime" both mean that), "exists" keeps any
# destination file that exists (--ignore-existing), "checksum" compares contents (--checksum).
_SYNC_LEVELS = {"exists": 0, "size": 1, "mtime": 2, "checksum": 3, 0: 0, 1: 1, 2: 2, 3: 3}


def join_endpoint(endpoint: str | None, path: str) -> str:
    """One side of a job from an endpoint and a path on it.

    * ``None`` or ``""``: a path on the service's own host (must be absolute there).
    * ``"tern://HOST[:PORT]"``: a path under that daemon's roots.
    * ``"[USER@]HOST"``: a path over ssh, ``HOST:PATH`` as scp writes it.
    * anything ending in ``":"`` or ``"/"`` is used as a prefix as it is.
    """
    if not endpoint:
        return path
    if endpoint.startswith("tern://"):
        return endpoint.rstrip("/") + "/" + path.lstrip("/")
    if endpoint.endswith((":", "/")):
        return endpoint + path
    return f"{endpoint}:{path}"


class TransferData:
    """A transfer to submit with :meth:`TransferClient.submit_transfer`.

    Example::

        tdata = TransferData(None, "tern://archive:7700", label="run42", sync_level="checksum")
        tdata.add_item("/data/run42", "/runs/run42", recursive=True)

    Args:
        source: the source endpoint (see :func:`join_endpoint`); ``None`` is the service's host.
        destination: the destination endpoint, likewise.
        label: shown in listings and notifications.
        sync_level: ``None`` copies everything (``tern cp -r``); ``"exists"``, ``"size"``,
            ``"mtime"`` or ``"checksum"`` (or 0-3) make it a ``tern sync``, which sends only
            what differs: ``"size"`` and ``"mtime"`` both compare size and mtime, ``"exists"``
            keeps every destination file that exists, ``"checksum"`` compares contents.
        delete_destination_extra: with ``sync_level``, delete destination files that are not
            in the source (``tern sync --delete``).
        verify_checksum: re-read and hash every landed file (``--verify-full``); tern always
            verifies each chunk as it lands, this adds a whole-file pass.
        deadline: RFC 3339 time or a duration from now (``"6h"``); the job fails if not done.
        notify: an ``https://`` webhook or ``mailto:`` address told when the job ends.
        fail_on_errors: stop at the first failed file (``--fail-fast``).
        skip_source_errors: not supported by tern (it already copies the rest and reports
            each failed file); accepted only as ``False``.
        **options: other job options of the API, as documented in ``docs/openapi.json``
            (``streams``, ``chunk_size``, ``bwlimit``, ``no_encrypt``, ``retry_for``,
            ``token_file``, ``dst_token_file``, ``remote_bin``, ``ignore_existing``, ...).
    """

    def __init__(
        self,
        source: str | None = None,
        destination: str | None = None,
        *,
        label: str | None = None,
        sync_level: Any = None,
        delete_destination_extra: bool = False,
        verify_checksum: bool = False,
        deadline: str | None = None,
        notify: str | None = None,
        fail_on_errors: bool = False,
        skip_source_errors: bool = False,
        **options: Any,
    ) -> None:
        if sync_level is not None and sync_level not in _SYNC_LEVELS:
            raise ValueError(f"sync_level {sync_level!r} is not one of exists, size, mtime, checksum (or 0-3)")
        if delete_destination_extra and sync_level is None:
            raise ValueError("delete_destination_extra needs a sync_level (it is tern sync --delete)")
        if skip_source_errors:
            raise ValueError("skip_source_errors is not supported: tern copies the other files and reports each failed one")
        self.source = source
        self.destination = destination
        self.label = label
        self.notify = notify
        self.sync = sync_level is not None
        self.items: list[dict[str, Any]] = []
        self.filter_rules: list[str] = []
        self.options: dict[str, Any] = dict(options)
        level = None if sync_level is None else _SYNC_LEVELS[sync_level]
        if level == 0:
            self.options["ignore_existing"] = True
        if level == 3:
            self.options["checksum"] = True
        if delete_destination_extra:
            self.options["delete"] = True
        if verify_checksum:
            self.options["verify_full"] = True
        if deadline is not None:
            self.options["deadline"] = deadline
        if fail_on_errors:
            self.options["fail_fast"] = True

    def add_item(self, source_path: str, destination_path: str, *, recursive: bool = True) -> TransferData:
        """Adds one source → destination pair; returns ``self`` so calls chain.

        Paths follow ``tern cp -r``: a directory copied to a destination that does not exist
        becomes it; to one that exists, it lands inside it (as ``cp -r``). ``recursive`` is
        accepted for Globus compatibility; tern always copies directories whole, so a
        ``recursive=False`` item whose source turns out to be a directory is copied whole too.
        """
        self.items.append(
            {
                "source_path": source_path,
                "destination_path": destination_path,
                "recursive": recursive,
                "src": join_endpoint(self.source, source_path),
                "dst": join_endpoint(self.destination, destination_path),
            }
        )
        return self

    def add_filter_rule(self, name: str, *, method: str = "exclude") -> TransferData:
        """Adds an rsync-style rule (``method`` ``"exclude"`` or ``"include"``); first match wins.

        ``name`` is a pattern as ``tern cp --exclude`` takes it (``*.tmp``, ``scratch/``).
        """
        if method not in ("exclude", "include"):
            raise ValueError(f"method {method!r} must be 'exclude' or 'include'")
        self.filter_rules.append(("- " if method == "exclude" else "+ ") + name)
        return self

    def specs(self) -> list[dict[str, Any]]:
        """The API's job specs (``POST /v1/jobs`` bodies), one per item."""
        if not self.items:
            raise ValueError("this TransferData has no items; call add_item(source_path, destination_path) first")
        options = dict(self.options)
        if self.filter_rules:
            options["filters"] = list(options.get("filters", [])) + self.filter_rules
        out = []
        for item in self.items:
            spec: dict[str, Any] = {"src": item["src"], "dst": item["dst"], "sync": self.sync, "options": options}
            if self.label is not None:
                spec["label"] = self.label
            if self.notify is not None:
                spec["notify"] = self.notify
            out.append(spec)
        return out
