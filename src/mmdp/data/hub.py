"""Is the Hugging Face Hub reachable? Answer in a few seconds, not after minutes of retries."""

import os
import socket
from urllib.parse import urlparse

from mmdp.errors import UserError


def offline_mode() -> bool:
    """Has the user asked the Hugging Face libraries to stay offline (HF_HUB_OFFLINE)?"""
    return os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("1", "true", "yes", "on")


def hub_offline_reason(timeout: float = 3.0) -> str | None:
    """Return why the Hub cannot be reached (no connection), or None."""
    endpoint = urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co"))
    port = endpoint.port or (443 if endpoint.scheme == "https" else 80)
    try:
        socket.create_connection((endpoint.hostname, port), timeout=timeout).close()
    except OSError as error:
        return f"cannot connect to {endpoint.hostname} ({error.__class__.__name__})"
    return None


def require_hub(what: str, default_hint: str) -> None:
    """Raise a one-sentence UserError when `what` would need the Hub and it is out of reach.

    With HF_HUB_OFFLINE set, the libraries can still serve a copy from the local Hugging Face cache,
    so the caller goes ahead and only a cache miss becomes an error.
    """
    if offline_mode():
        return
    reason = hub_offline_reason()
    if reason is not None:
        raise UserError(
            f"{what} must be downloaded from the Hugging Face Hub, which is out of reach "
            f"({reason}); {default_hint}"
        )


def looks_like_a_path(name: str) -> bool:
    """A local path rather than a Hub name ("owner/name"): absolute, relative, home or a file."""
    return (
        name.startswith(("/", ".", "~"))
        or name.count("/") > 1
        or name.endswith((".parquet", ".arrow", ".json", ".jsonl"))
    )
