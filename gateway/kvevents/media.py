"""The medium a KV block is held on, as the ledger records it (upper case, after decoding an event).

An open set, on purpose: neither an enum nor a `Literal`.
- vLLM's events carry `medium` as free text: `GPU` and `CPU` (the OffloadingConnector) today, `STORAGE` in
  its own documentation, and whatever a future tier or connector calls itself.
- LMCache names its storage backends (`LocalCPUBackend`, `LocalDiskBackend`, `redis`, `mooncake`, ...);
  formats/lmcache.py maps the known ones onto CPU, DISK or REMOTE, and keeps an unknown one as its own name,
  upper-cased, so the audit shows it, by name, as a medium no tenant allowed.
- A store may hold names another gateway version wrote.
Closing the set would mean renaming or dropping a medium nobody foresaw, which would hide exactly what the
audit exists to show. The closed vocabulary is the policy's (`gateway.policy.model.Medium`, what
`allowed_media` may list); an observed medium is compared with it, never converted to it.

`BlockMedium` is an alias of `str`, not a `NewType`: the values cross the store (read back as plain text) and
come from tests and tools as literals, and a cast at each of those places would check nothing.
"""

from __future__ import annotations

from typing import Final, TypeAlias

BlockMedium: TypeAlias = str

GPU: Final[BlockMedium] = "GPU"  # vLLM's GPU block pool (also the medium of events from before `medium` existed)
CPU: Final[BlockMedium] = "CPU"  # vLLM's CPU offload tier; LMCache's memory backends
STORAGE: Final[BlockMedium] = "STORAGE"  # a vLLM offload tier below CPU
DISK: Final[BlockMedium] = "DISK"  # LMCache's disk-like backends
REMOTE: Final[BlockMedium] = "REMOTE"  # LMCache's network backends
KNOWN_MEDIA: Final[tuple[BlockMedium, ...]] = (GPU, CPU, STORAGE, DISK, REMOTE)
