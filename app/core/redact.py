"""Passwords in URLs (`postgresql://user:PASSWORD@host/db` in hpo.storage), kept out of what is
printed, logged or sent to a tracker. The sweeper (hydra_plugins/.../_storage.py) also masks the
passwords it has seen wherever they appear; this is the part both need."""

from __future__ import annotations

import re

MASK = "***"
URL_PASSWORD = re.compile(r"(?P<head>\b[A-Za-z][\w+.-]*://[^/:@\s]*:)(?P<password>[^@/\s]+)@")


def mask_url_passwords(text: str) -> str:
    """scheme://user:PASSWORD@host -> scheme://user:***@host, for every URL in `text`."""
    return URL_PASSWORD.sub(lambda m: f"{m.group('head')}{MASK}@", text)
