"""What this simulator emitted on its KV-event socket, per cache salt and medium: the ground truth a ledger
is checked against (`GET /sim/kv-truth`). Counted when a batch is sent, in send order, with vLLM's rules:
a GPU chain's blocks belong to its root's salt and children to their parent's; a CPU block belongs to the
GPU block whose hash it carries; `AllBlocksCleared` empties the GPU tier. A test seam, not a vLLM feature.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gateway.sim.kv_events import Event

NO_SALT = ""


@dataclass
class Tally:
    stored: int = 0
    removed: int = 0

    @property
    def resident(self) -> int:
        return self.stored - self.removed


@dataclass
class EmittedTruth:
    owners: dict[int, str] = field(default_factory=dict)  # hash -> salt, every block ever stored
    resident: dict[tuple[str, int], str] = field(default_factory=dict)  # (medium, hash) -> salt
    tallies: dict[tuple[str, str], Tally] = field(default_factory=dict)  # (salt, medium)
    batches: int = 0

    def sent(self, events: list[Event]) -> None:
        self.batches += 1
        for event in events:
            kind = event.get("type")
            if kind == "BlockStored":
                self._stored(event)
            elif kind == "BlockRemoved":
                for block in event["block_hashes"]:
                    self._removed(event["medium"], block)
            elif kind == "AllBlocksCleared":
                for medium, block in [key for key in self.resident if key[0] == "GPU"]:
                    self._removed(medium, block)

    def _stored(self, event: Event) -> None:
        medium, parent = event["medium"], event.get("parent_block_hash")
        extra = event.get("extra_keys") or [None]
        root_keys = extra[0] if extra else None
        salt = (root_keys[0] if root_keys else NO_SALT) if parent is None else self.owners.get(parent, NO_SALT)
        for block in event["block_hashes"]:
            owner = self.owners.get(block, salt) if medium != "GPU" else salt
            self.owners.setdefault(block, owner)
            if (medium, block) not in self.resident:
                self.resident[(medium, block)] = owner
                self._tally(owner, medium).stored += 1

    def _removed(self, medium: str, block: int) -> None:
        owner = self.resident.pop((medium, block), None)
        if owner is not None:
            self._tally(owner, medium).removed += 1

    def _tally(self, salt: str, medium: str) -> Tally:
        return self.tallies.setdefault((salt, medium), Tally())

    def view(self) -> dict[str, Any]:
        by_salt: dict[str, dict[str, dict[str, int]]] = {}
        for (salt, medium), tally in sorted(self.tallies.items()):
            by_salt.setdefault(salt, {})[medium] = {"stored": tally.stored, "removed": tally.removed,
                                                    "resident": tally.resident}
        return {"batches_sent": self.batches, "by_salt": by_salt}
