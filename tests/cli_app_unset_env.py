"""An --app module that reads an unset environment variable at import, as many do."""

from __future__ import annotations

import os

import postonce

client = postonce.Client(
    "https://api.stripe.com", headers={"Authorization": os.environ["POSTONCE_TEST_NEVER_SET"]}
)
