"""Objects written the way big files reach a store, through the adapters' own clients."""

from __future__ import annotations

from typing import Any, cast

from shared.storage import ObjectStore


async def upload_without_md5(store: ObjectStore, backend: str, key: str, data: bytes) -> None:
    """Write ``key`` the way big files reach the store, leaving it with no MD5 the store keeps.

    S3: a multipart upload (one part; any size is allowed for the last part). Azure: a block
    list (what the SDK and Hadoop's connector do for large blobs). Uses the adapters' clients.
    """
    s: Any = cast(Any, store)
    full = s._full(key)
    if backend == "s3":
        client = await s._s3()
        up = await client.create_multipart_upload(Bucket=s._bucket, Key=full)
        part = await client.upload_part(
            Bucket=s._bucket, Key=full, UploadId=up["UploadId"], PartNumber=1, Body=data
        )
        await client.complete_multipart_upload(
            Bucket=s._bucket,
            Key=full,
            UploadId=up["UploadId"],
            MultipartUpload={"Parts": [{"ETag": part["ETag"], "PartNumber": 1}]},
        )
    elif backend == "azure":
        blob = s._cc().get_blob_client(full)
        await blob.stage_block("YmxvY2stMDAwMQ==", data)
        await blob.commit_block_list(["YmxvY2stMDAwMQ=="])
    else:
        raise AssertionError(f"{backend} keeps an MD5 of every object")
