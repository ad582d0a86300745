"""OpenAI's Files and Batch routes on the ingress (a mixin of deployments.ingress.Ingress):

POST /v1/files (purpose `batch`, JSONL), GET /v1/files/{id}, GET /v1/files/{id}/content,
POST /v1/batches, GET /v1/batches, GET /v1/batches/{id}, POST /v1/batches/{id}/cancel.
Files and batches belong to the tenant that created them; another tenant gets 404.
"""

from __future__ import annotations

import logging
from pathlib import Path

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from deployments.batch_jsonl import parse_file
from deployments.errors import APIError

log = logging.getLogger("kvserve.batch")
batch_router = APIRouter()
MULTIPART_OVERHEAD = 64 * 1024  # boundaries, part headers and the `purpose` field around the file


def default_db_path() -> Path:
    from kvserve.model import cache_root

    return cache_root() / "batch.sqlite"


class BatchRoutes:
    """Needs the ingress's cfg, _tenant() and _read_json(); start_batch() runs in its constructor."""

    def start_batch(self) -> None:
        from deployments.batch_store import BatchStore
        from deployments.batch_worker import BatchWorker, PriorityGate

        b = self.cfg.batch
        self.batch_gate = PriorityGate(b.max_concurrency, b.concurrency_under_load, self.cfg.server.request_timeout_s,
                                       b.idle_after_s)
        self.batch_store = None
        if not b.enabled:
            return
        self.batch_store = BatchStore(b.db_path or default_db_path())
        self.batch_worker = BatchWorker(self.batch_store, self.run_batch_line, self.batch_gate, b.max_attempts)
        self.batch_worker.start()  # resumes what a previous ingress left unfinished

    def _batches(self) -> None:
        if self.batch_store is None:
            raise APIError(404, "the Batch API is disabled on this server (batch.enabled)")

    async def _upload(self, request: Request) -> tuple[str, str, bytes]:
        """(filename, purpose, content) of a multipart upload, within batch.max_file_bytes (else 413)."""
        limit = self.cfg.batch.max_file_bytes
        declared = request.headers.get("content-length")
        if declared and declared.isdigit() and int(declared) > limit + MULTIPART_OVERHEAD:
            raise APIError(413, f"the upload is {declared} bytes; the file limit is {limit} bytes")
        body = b""
        async for part in request.stream():
            body += part
            if len(body) > limit + MULTIPART_OVERHEAD:
                raise APIError(413, f"the upload exceeds the file limit of {limit} bytes")

        async def replay() -> dict:
            return {"type": "http.request", "body": body, "more_body": False}

        try:
            form = await Request(request.scope, replay).form()
        except Exception as e:  # starlette's parser errors: not multipart, bad boundary, ...
            raise APIError(400, f"expected a multipart/form-data upload with `file` and `purpose` ({e})") from None
        purpose, upload = form.get("purpose"), form.get("file")
        if purpose != "batch":
            raise APIError(400, f"purpose must be 'batch', got {purpose!r}", "purpose")
        if upload is None or isinstance(upload, str):
            raise APIError(400, "missing the `file` part", "file")
        content = await upload.read()
        if len(content) > limit:
            raise APIError(413, f"the file is {len(content)} bytes; the limit is {limit} bytes", "file")
        return upload.filename or "upload.jsonl", purpose, content

    async def run_batch_line(self, kind: str, body: dict, tenant: str) -> tuple[int, dict]:
        """One batch line through the same checks, rendering and routing as an HTTP request."""
        import json
        import time

        start = time.monotonic()
        try:
            self._check_limits(kind, body)
            work = await self._render(kind, body, tenant)
        except APIError as e:
            return e.status, e.body()
        response = await self._dispatch(kind, work, start, interactive=False)
        return response.status_code, json.loads(response.body)

    # -- routes --------------------------------------------------------------------------------------

    @batch_router.post("/v1/files")
    async def create_file(self, request: Request):
        try:
            tenant = self._tenant(request)
            self._batches()
            filename, purpose, content = await self._upload(request)
        except APIError as e:
            return e.response()
        return self.batch_store.add_file(tenant, filename, purpose, content)

    @batch_router.get("/v1/files/{file_id}")
    async def retrieve_file(self, file_id: str, request: Request):
        try:
            tenant = self._tenant(request)
            self._batches()
            f = self.batch_store.get_file(tenant, file_id)
            if f is None:
                raise APIError(404, f"No such File object: {file_id}", "file_id")
        except APIError as e:
            return e.response()
        return f

    @batch_router.get("/v1/files/{file_id}/content")
    async def file_content(self, file_id: str, request: Request):
        try:
            tenant = self._tenant(request)
            self._batches()
            content = self.batch_store.file_content(tenant, file_id)
            if content is None:
                raise APIError(404, f"No such File object: {file_id}", "file_id")
        except APIError as e:
            return e.response()
        return Response(content, media_type="application/octet-stream")

    @batch_router.post("/v1/batches")
    async def create_batch(self, request: Request):
        try:
            tenant = self._tenant(request)
            self._batches()
            data = await self._read_json(request)
            for key in ("input_file_id", "endpoint", "completion_window"):
                if not isinstance(data.get(key), str):
                    raise APIError(400, f"Missing required parameter: '{key}'.", key, "missing_required_parameter")
            if data["completion_window"] != "24h":
                raise APIError(400, "completion_window must be '24h'", "completion_window")
            metadata = data.get("metadata")
            if metadata is not None and not isinstance(metadata, dict):
                raise APIError(400, "metadata must be an object", "metadata")
            fid = data["input_file_id"]
            content = self.batch_store.file_content(tenant, fid)
            if content is None:
                raise APIError(400, f"input_file_id {fid!r} is not a file of yours", "input_file_id")
            lines = parse_file(content, data["endpoint"], self.cfg.model.name, self.cfg.batch.max_lines)
        except APIError as e:
            return e.response()
        batch = self.batch_store.create_batch(tenant, fid, data["endpoint"], "24h", metadata, self.cfg.model.name,
                                              lines)
        self.batch_worker.wake()
        return batch

    @batch_router.get("/v1/batches")
    async def list_batches(self, request: Request, limit: int = 20):
        try:
            tenant = self._tenant(request)
            self._batches()
        except APIError as e:
            return e.response()
        data = self.batch_store.list_batches(tenant, max(1, min(limit, 100)))
        return {"object": "list", "data": data, "first_id": data[0]["id"] if data else None,
                "last_id": data[-1]["id"] if data else None, "has_more": False}

    @batch_router.get("/v1/batches/{batch_id}")
    async def retrieve_batch(self, batch_id: str, request: Request):
        return self._batch_or_404(request, batch_id, cancel=False)

    @batch_router.post("/v1/batches/{batch_id}/cancel")
    async def cancel_batch(self, batch_id: str, request: Request):
        return self._batch_or_404(request, batch_id, cancel=True)

    def _batch_or_404(self, request: Request, batch_id: str, cancel: bool):
        try:
            tenant = self._tenant(request)
            self._batches()
            store = self.batch_store
            batch = store.cancel(tenant, batch_id) if cancel else store.get_batch(tenant, batch_id)
            if batch is None:
                raise APIError(404, f"No such Batch object: {batch_id}", "batch_id")
        except APIError as e:
            return e.response()
        if cancel:
            self.batch_worker.wake()
        return JSONResponse(batch)
