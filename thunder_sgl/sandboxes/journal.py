"""A small on-disk record of containers that programs registered themselves.

Containers the router creates carry its labels, so a restarted router finds them by label.
A container an agent created itself and registered through ``POST /programs/{id}/resources``
carries no label of ours (labels cannot be added to a running container), so the manager
writes its id and owner here; the start-up sweep of a router with the same state reads it.
The file is rewritten atomically (write + rename) on every change; it stays small because
entries leave it when their program is released.
"""

from __future__ import annotations

import json
import os
from pathlib import Path


class ResourceJournal:
    def __init__(self, path: Path | None) -> None:
        self.path = path
        self._entries: dict[str, str] = self._load()

    def _load(self) -> dict[str, str]:
        if self.path is None:
            return {}
        try:
            data = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return {}
        containers = data.get("containers") if isinstance(data, dict) else None
        return {str(k): str(v) for k, v in containers.items()} if isinstance(containers, dict) else {}

    def containers(self) -> dict[str, str]:
        """Container id → owning program id."""
        return dict(self._entries)

    def add(self, container_id: str, program_id: str) -> None:
        self._entries[container_id] = program_id
        self._save()

    def discard(self, container_ids: list[str]) -> None:
        popped = [self._entries.pop(c, None) for c in container_ids]
        if any(p is not None for p in popped):
            self._save()

    def _save(self) -> None:
        if self.path is None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(self.path.suffix + ".tmp")
        tmp.write_text(json.dumps({"containers": self._entries}))
        os.replace(tmp, self.path)
