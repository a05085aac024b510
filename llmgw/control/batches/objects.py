"""The File and Batch objects as OpenAI writes them (``client.files`` / ``client.batches`` read these)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel

from llmgw.control.store.batches import StoredBatch, StoredFile

STATUSES = ("validating", "failed", "in_progress", "finalizing", "completed", "expired", "cancelling", "cancelled")


class FileObject(BaseModel):
    id: str
    object: Literal["file"] = "file"
    bytes: int
    created_at: int
    filename: str
    purpose: str
    status: Literal["uploaded", "processed", "error"] = "processed"
    status_details: str | None = None
    expires_at: int | None = None


class FileList(BaseModel):
    object: Literal["list"] = "list"
    data: list[FileObject]
    first_id: str | None = None
    last_id: str | None = None
    has_more: bool = False


class FileDeleted(BaseModel):
    id: str
    object: Literal["file"] = "file"
    deleted: bool


class RequestCounts(BaseModel):
    total: int
    completed: int
    failed: int


class BatchError(BaseModel):
    code: str | None = None
    message: str | None = None
    param: str | None = None
    line: int | None = None


class BatchErrors(BaseModel):
    object: Literal["list"] = "list"
    data: list[BatchError]


class BatchObject(BaseModel):
    id: str
    object: Literal["batch"] = "batch"
    endpoint: str
    errors: BatchErrors | None = None
    input_file_id: str
    completion_window: str
    status: str
    output_file_id: str | None = None
    error_file_id: str | None = None
    created_at: int
    in_progress_at: int | None = None
    expires_at: int | None = None
    finalizing_at: int | None = None
    completed_at: int | None = None
    failed_at: int | None = None
    expired_at: int | None = None
    cancelling_at: int | None = None
    cancelled_at: int | None = None
    request_counts: RequestCounts
    metadata: dict[str, str] | None = None


class BatchList(BaseModel):
    object: Literal["list"] = "list"
    data: list[BatchObject]
    first_id: str | None = None
    last_id: str | None = None
    has_more: bool = False


def file_object(f: StoredFile) -> FileObject:
    return FileObject(id=f.id, bytes=f.bytes, created_at=int(f.created_at), filename=f.filename, purpose=f.purpose)


def batch_object(b: StoredBatch, counts: tuple[int, int, int]) -> BatchObject:
    def at(status: str) -> int | None:
        t = b.times.get(status)
        return None if t is None else int(t)

    errors = BatchErrors(data=[BatchError(**e) for e in b.errors]) if b.errors else None
    return BatchObject(id=b.id, endpoint=b.endpoint, errors=errors, input_file_id=b.input_file_id,
                       completion_window=b.completion_window, status=b.status, output_file_id=b.output_file_id,
                       error_file_id=b.error_file_id, created_at=int(b.created_at), in_progress_at=at("in_progress"),
                       expires_at=int(b.expires_at), finalizing_at=at("finalizing"), completed_at=at("completed"),
                       failed_at=at("failed"), expired_at=at("expired"), cancelling_at=at("cancelling"),
                       cancelled_at=at("cancelled"),
                       request_counts=RequestCounts(total=counts[0], completed=counts[1], failed=counts[2]),
                       metadata=b.metadata)


def dump(model: BaseModel) -> dict[str, Any]:
    return model.model_dump(mode="json")
