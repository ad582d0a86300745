"""Collect the engine's KV-cache events inside the replica (ZMQ SUB on a per-replica IPC socket).

vLLM publishes BlockStored/BlockRemoved/AllBlocksCleared batches over ZMQ; a
daemon thread decodes them with vLLM's own msgspec types and applies them to an
EngineBlockSet, which the replica ships to routers in its routing stats.
"""

from __future__ import annotations

import logging
import tempfile
import threading
import uuid
from pathlib import Path

from deployments.vllm_compat import get
from router.engine_blocks import EngineBlockSet

log = logging.getLogger(__name__)


def first_block_salt(ev) -> str | None:
    """The cache_salt of a stored prompt's first block, from the event's untagged extra keys
    (LoRA name, (mm id, offset) pairs, salt, ... in that order; LoRA events are skipped upstream,
    so the first string is the salt). vLLM 0.24's events carry no extra keys."""
    keys = getattr(ev, "extra_keys", None)
    if ev.parent_block_hash is not None or not keys or not keys[0]:
        return None
    return next((k for k in keys[0] if isinstance(k, str)), None)


def new_ipc_endpoint() -> str:
    return f"ipc://{Path(tempfile.gettempdir()) / f'kvserve-kv-{uuid.uuid4().hex[:12]}.sock'}"


class KVEventCollector:
    def __init__(self, endpoint: str, block_size: int) -> None:
        self.endpoint = endpoint
        self.blocks = EngineBlockSet(block_size)
        self.events_seen = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="kv-events", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def snapshot(self) -> tuple[int, list[int]]:
        with self._lock:
            return self.blocks.version, self.blocks.snapshot()

    def clear(self) -> None:
        """The engine emptied its cache. Its AllBlocksCleared event goes out only with its next step,
        in order before any new block, so forgetting the blocks now loses nothing."""
        with self._lock:
            self.blocks.cleared()

    def prefix_blocks(self, hashes: list[int]) -> int:
        with self._lock:
            return self.blocks.prefix_blocks(hashes)

    def _run(self) -> None:
        import msgspec
        import zmq


        AllBlocksCleared, BlockRemoved, BlockStored = get("AllBlocksCleared"), get("BlockRemoved"), get("BlockStored")
        KVEventBatch = get("KVEventBatch")
        decoder = msgspec.msgpack.Decoder(type=KVEventBatch)
        ctx = zmq.Context.instance()
        sock = ctx.socket(zmq.SUB)
        sock.setsockopt(zmq.SUBSCRIBE, b"")
        sock.setsockopt(zmq.RCVTIMEO, 200)
        sock.connect(self.endpoint)
        try:
            while not self._stop.is_set():
                try:
                    parts = sock.recv_multipart()
                except zmq.Again:
                    continue
                try:
                    batch = decoder.decode(parts[-1])
                except Exception:  # a malformed message must not kill the collector
                    log.exception("undecodable KV event batch")
                    continue
                with self._lock:
                    for ev in batch.events:
                        self.events_seen += 1
                        if isinstance(ev, BlockStored):
                            if ev.lora_id is None and (ev.group_idx in (None, 0)):
                                self.blocks.stored(ev.block_hashes, ev.parent_block_hash, ev.token_ids,
                                                  first_block_salt(ev))
                        elif isinstance(ev, BlockRemoved):
                            self.blocks.removed(ev.block_hashes)
                        elif isinstance(ev, AllBlocksCleared):
                            self.blocks.cleared()
        finally:
            sock.close(linger=0)
