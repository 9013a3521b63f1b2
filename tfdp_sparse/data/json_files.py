"""Reading the project's own JSON files (vocabularies, prepared-data manifests) with a format and version.

Example::

    payload = load_format_json("vocab.json", "tfdp_sparse.criteo_vocabularies", 1, "vocabulary")
    # ValueError "vocab.json: not a vocabulary JSON file (...)" for broken JSON,
    # "... not a tfdp_sparse.criteo_vocabularies vocabulary" for another format,
    # "... unsupported vocabulary version 2 (this reader knows 1)" for another version.
"""

from __future__ import annotations

import json
import os
from typing import Union


def load_format_json(path: Union[str, os.PathLike], fmt: str, version: int, kind: str) -> dict:
    """The JSON object at ``path`` whose ``format`` is ``fmt`` and ``version`` is ``version``."""
    path = os.fspath(path)
    with open(path, "r", encoding="utf-8") as f:
        try:
            payload = json.load(f)
        except json.JSONDecodeError as err:
            raise ValueError(f"{path}: not a {kind} JSON file ({err})") from None
    if not isinstance(payload, dict) or payload.get("format") != fmt:
        raise ValueError(f"{path}: not a {fmt} {kind}")
    if payload.get("version") != version:
        raise ValueError(f"{path}: unsupported {kind} version {payload.get('version')!r} (this reader knows "
                         f"{version})")
    return payload
