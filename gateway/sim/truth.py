"""What this simulator emitted on its KV-event socket, per cache salt and medium: the ground truth a ledger
is checked against (`GET /sim/kv-truth`). Counted when a batch is sent, in send order. A newly stored block
belongs to the request whose step stored it (the engine names its cache salt; nothing is inferred from the
events, so the truth does not share the ledger's attribution rules); a removal ends the block's residence on
its medium; `AllBlocksCleared` empties the GPU tier. A test seam, not a vLLM feature.
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
    resident: dict[tuple[str, int], str] = field(default_factory=dict)  # (medium, hash) -> salt
    tallies: dict[tuple[str, str], Tally] = field(default_factory=dict)  # (salt, medium)
    batches: int = 0

    def sent(self, events: list[Event], owner: str | None) -> None:
        self.batches += 1
        for event in events:
            kind = event.get("type")
            if kind == "BlockStored":
                self._stored(event, owner or NO_SALT)
            elif kind == "BlockRemoved":
                for block in event["block_hashes"]:
                    self._removed(event["medium"], block)
            elif kind == "AllBlocksCleared":
                for medium, block in [key for key in self.resident if key[0] == "GPU"]:
                    self._removed(medium, block)

    def _stored(self, event: Event, owner: str) -> None:
        medium = event["medium"]
        for block in event["block_hashes"]:
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
