"""Python client for the tern transfer service (``tern serve --http-listen``).

Shaped like the Globus SDK's transfer client::

    from tern_client import TransferClient, TransferData

    tc = TransferClient("https://dtn1:7443", token=token, ca_cert="/var/lib/tern/tls/cert.pem")
    tdata = TransferData(None, "tern://archive:7700", label="run42")
    tdata.add_item("/data/run42", "/runs/run42", recursive=True)
    job = tc.submit_transfer(tdata)
    if tc.task_wait(job["id"], timeout=3600):
        print(tc.get_task(job["id"])["state"])
"""

from .client import TERMINAL_STATES, TransferClient
from .data import TransferData, join_endpoint
from .errors import NetworkError, TernError, TransferAPIError

__all__ = ["TERMINAL_STATES", "NetworkError", "TernError", "TransferAPIError", "TransferClient", "TransferData", "join_endpoint"]
__version__ = "0.1.0"
