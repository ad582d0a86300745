"""Batch API persistence in one embedded SQLite database: files, batches and every line's state.

A line is `pending` until its result is written, in one transaction, as `done` or `error`; a result
for a line that is no longer pending is dropped, so each line is answered exactly once. After a
restart every pending line of an unfinished batch simply runs again (it never reached the store).
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from deployments.batch_jsonl import InputLine, error_record, to_jsonl

COMPLETION_WINDOW_S = {"24h": 86400}
_SCHEMA = """
CREATE TABLE IF NOT EXISTS files (
  id TEXT PRIMARY KEY, tenant TEXT NOT NULL, filename TEXT, purpose TEXT, bytes INTEGER,
  created_at INTEGER, content BLOB);
CREATE TABLE IF NOT EXISTS batches (
  id TEXT PRIMARY KEY, tenant TEXT NOT NULL, doc TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS lines (
  batch_id TEXT NOT NULL, idx INTEGER NOT NULL, custom_id TEXT, body TEXT,
  state TEXT NOT NULL, record TEXT, PRIMARY KEY (batch_id, idx));
CREATE INDEX IF NOT EXISTS lines_pending ON lines (batch_id, state);
"""
UNFINISHED = ("validating", "in_progress", "finalizing", "cancelling")


def _now() -> int:
    return int(time.time())


class BatchStore:
    def __init__(self, path: str | Path) -> None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        # WAL + NORMAL: a committed line survives a process crash (a restart); only an OS crash can lose
        # the last few, which then simply run again.
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.executescript(_SCHEMA)
        self._lock = threading.Lock()

    def _tx(self, fn):
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                out = fn(self._db)
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")
            return out

    # -- files -------------------------------------------------------------------------------------

    def add_file(self, tenant: str, filename: str, purpose: str, content: bytes) -> dict:
        fid, now = f"file-{uuid.uuid4().hex[:24]}", _now()
        self._tx(lambda db: db.execute("INSERT INTO files VALUES (?,?,?,?,?,?,?)",
                                       (fid, tenant, filename, purpose, len(content), now, content)))
        return self.get_file(tenant, fid)  # type: ignore[return-value]

    def get_file(self, tenant: str, fid: str) -> dict | None:
        with self._lock:
            row = self._db.execute("SELECT id, filename, purpose, bytes, created_at FROM files WHERE id=? AND tenant=?",
                                   (fid, tenant)).fetchone()
        if row is None:
            return None
        return {"id": row[0], "object": "file", "bytes": row[3], "created_at": row[4], "filename": row[1],
                "purpose": row[2], "status": "processed", "expires_at": None, "status_details": None}

    def file_content(self, tenant: str, fid: str) -> bytes | None:
        with self._lock:
            row = self._db.execute("SELECT content FROM files WHERE id=? AND tenant=?", (fid, tenant)).fetchone()
        return None if row is None else bytes(row[0])

    # -- batches -----------------------------------------------------------------------------------

    def create_batch(self, tenant: str, input_file_id: str, endpoint: str, window: str, metadata: dict | None,
                     model: str, lines: list[InputLine]) -> dict:
        bid, now = f"batch_{uuid.uuid4().hex[:24]}", _now()
        doc = {"id": bid, "object": "batch", "endpoint": endpoint, "errors": None, "input_file_id": input_file_id,
               "completion_window": window, "status": "in_progress", "output_file_id": None,
               "error_file_id": None, "created_at": now, "in_progress_at": now,
               "expires_at": now + COMPLETION_WINDOW_S[window], "finalizing_at": None, "completed_at": None,
               "failed_at": None, "expired_at": None, "cancelling_at": None, "cancelled_at": None,
               "request_counts": {"total": len(lines), "completed": 0, "failed": 0}, "metadata": metadata,
               "model": model}
        rows = [(bid, ln.idx, ln.custom_id, json.dumps(ln.body) if ln.body is not None else None,
                 "pending" if ln.body is not None else "error",
                 None if ln.body is not None else json.dumps(error_record(ln.custom_id, ln.error or {})))
                for ln in lines]

        def tx(db):
            db.execute("INSERT INTO batches VALUES (?,?,?)", (bid, tenant, json.dumps(doc)))
            db.executemany("INSERT INTO lines VALUES (?,?,?,?,?,?)", rows)
        self._tx(tx)
        return self.get_batch(tenant, bid)  # type: ignore[return-value]

    def _doc(self, db, bid: str) -> dict:
        return json.loads(db.execute("SELECT doc FROM batches WHERE id=?", (bid,)).fetchone()[0])

    def _counts(self, db, bid: str) -> dict:
        got = dict(db.execute("SELECT state, COUNT(*) FROM lines WHERE batch_id=? GROUP BY state", (bid,)).fetchall())
        done, failed, pending = got.get("done", 0), got.get("error", 0), got.get("pending", 0)
        return {"total": done + failed + pending, "completed": done, "failed": failed}

    def get_batch(self, tenant: str | None, bid: str) -> dict | None:
        with self._lock:
            row = self._db.execute("SELECT tenant, doc FROM batches WHERE id=?", (bid,)).fetchone()
            if row is None or (tenant is not None and row[0] != tenant):
                return None
            doc = json.loads(row[1])
            doc["request_counts"] = self._counts(self._db, bid)
        return doc

    def list_batches(self, tenant: str, limit: int = 20) -> list[dict]:
        with self._lock:
            ids = [r[0] for r in self._db.execute(
                "SELECT id FROM batches WHERE tenant=? ORDER BY rowid DESC LIMIT ?", (tenant, limit))]
        return [self.get_batch(tenant, b) for b in ids]  # type: ignore[misc]

    def status(self, bid: str) -> str:
        with self._lock:
            return json.loads(self._db.execute("SELECT doc FROM batches WHERE id=?", (bid,)).fetchone()[0])["status"]

    def tenant_of(self, bid: str) -> str:
        with self._lock:
            return self._db.execute("SELECT tenant FROM batches WHERE id=?", (bid,)).fetchone()[0]

    def unfinished(self) -> list[str]:
        """Batches a restart must pick up again."""
        with self._lock:
            rows = self._db.execute("SELECT id, doc FROM batches ORDER BY rowid").fetchall()
        return [bid for bid, doc in rows if json.loads(doc)["status"] in UNFINISHED]

    def _set(self, db, bid: str, **fields: Any) -> dict:
        doc = {**self._doc(db, bid), **fields}
        db.execute("UPDATE batches SET doc=? WHERE id=?", (json.dumps(doc), bid))
        return doc

    def cancel(self, tenant: str, bid: str) -> dict | None:
        def tx(db):
            row = db.execute("SELECT tenant, doc FROM batches WHERE id=?", (bid,)).fetchone()
            if row is None or row[0] != tenant:
                return False
            if json.loads(row[1])["status"] in ("in_progress", "validating"):
                self._set(db, bid, status="cancelling", cancelling_at=_now())
            return True
        return self.get_batch(tenant, bid) if self._tx(tx) else None

    # -- lines -------------------------------------------------------------------------------------

    def pending(self, bid: str, exclude: set[int], limit: int) -> list[tuple[int, str | None, dict]]:
        with self._lock:
            rows = self._db.execute("SELECT idx, custom_id, body FROM lines WHERE batch_id=? AND state='pending' "
                                    "ORDER BY idx LIMIT ?", (bid, len(exclude) + limit)).fetchall()
        return [(i, c, json.loads(b)) for i, c, b in rows if i not in exclude][:limit]

    def finish_line(self, bid: str, idx: int, ok: bool, record: dict) -> bool:
        """Store a line's result once; False (and nothing written) if it was already answered."""
        def tx(db):
            cur = db.execute("UPDATE lines SET state=?, record=? WHERE batch_id=? AND idx=? AND state='pending'",
                             ("done" if ok else "error", json.dumps(record), bid, idx))
            return cur.rowcount == 1
        return self._tx(tx)

    def finalize(self, bid: str) -> dict:
        """Write the output and error files and close the batch (completed, or cancelled)."""
        def tx(db):
            doc = self._doc(db, bid)
            tenant = db.execute("SELECT tenant FROM batches WHERE id=?", (bid,)).fetchone()[0]
            cancelled = doc["status"] == "cancelling"
            rows = db.execute("SELECT state, record FROM lines WHERE batch_id=? AND state!='pending' ORDER BY idx",
                              (bid,)).fetchall()
            now = _now()
            files = {}
            for state, purpose in (("done", "output"), ("error", "error")):
                records = [json.loads(r) for s, r in rows if s == state]
                if not records and purpose == "error":
                    continue
                fid = f"file-{uuid.uuid4().hex[:24]}"
                content = to_jsonl(records)
                db.execute("INSERT INTO files VALUES (?,?,?,?,?,?,?)",
                           (fid, tenant, f"{bid}_{purpose}.jsonl", "batch_output", len(content), now, content))
                files[f"{purpose}_file_id"] = fid
            ends = {"status": "cancelled", "cancelled_at": now} if cancelled else {"status": "completed",
                                                                                   "completed_at": now}
            self._set(db, bid, finalizing_at=now, **files, **ends)
        self._tx(tx)
        return self.get_batch(None, bid)  # type: ignore[return-value]

    def close(self) -> None:
        with self._lock:
            self._db.close()
