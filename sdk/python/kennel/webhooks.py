"""Checks a callback from Kennel as the Standard Webhooks specification says: the
``webhook-signature`` header holds ``v1,<base64 HMAC-SHA256>`` of ``{id}.{timestamp}.{body}``
under the secret (``whsec_`` + base64), and ``webhook-timestamp`` must be recent.

    from kennel import verify_webhook
    info = verify_webhook(SECRET, request.headers, request.body)   # a RunInfo, or raises
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time
from typing import Mapping, Optional, Union

from .results import RunInfo


class WebhookVerificationError(Exception):
    """The callback is not Kennel's: a wrong signature, a stale timestamp, missing headers."""


def _header(headers: Mapping[str, str], name: str) -> str:
    for k, v in headers.items():
        if k.lower() == name:
            return v
    raise WebhookVerificationError(f"no {name} header")


def verify_webhook(secret: str, headers: Mapping[str, str], body: Union[bytes, str],
                   tolerance: float = 300, now: Optional[float] = None) -> RunInfo:
    """The run a callback reports, once its signature and timestamp check out (``tolerance``
    seconds either way of ``now``); raises :class:`WebhookVerificationError` otherwise."""
    raw = body.encode() if isinstance(body, str) else bytes(body)
    if not secret.startswith("whsec_"):
        raise WebhookVerificationError("the secret must start with whsec_")
    key = base64.b64decode(secret[len("whsec_"):])
    msg_id = _header(headers, "webhook-id")
    try:
        timestamp = int(_header(headers, "webhook-timestamp"))
    except ValueError:
        raise WebhookVerificationError("webhook-timestamp is not a number") from None
    now = time.time() if now is None else now
    if abs(now - timestamp) > tolerance:
        raise WebhookVerificationError("webhook-timestamp is too old or too new")
    signed = f"{msg_id}.{timestamp}.".encode() + raw
    expected = base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode()
    # The header may hold several space-separated signatures (a key being rotated).
    for sig in _header(headers, "webhook-signature").split():
        version, _, value = sig.partition(",")
        if version == "v1" and hmac.compare_digest(value, expected):
            return RunInfo.from_dict(json.loads(raw))
    raise WebhookVerificationError("no signature matches")
