"""Object storage for weights and large payloads: one interface, a local directory or S3.

    LocalStore(root)            file:///abs/root/<key>      the embedded default
    S3Store(endpoint, bucket)   s3://<bucket>/<key>         MinIO, SeaweedFS, AWS … via `minio`

Keys are `/`-separated relative paths. Writes go to a temporary name and are renamed (local) or
are single PUTs (S3), so a reader never sees half an object; that a *set* of objects is complete
is what checkpoint manifests are for (`rollwire.core.weight_versions`).
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import time
from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Annotated, Any, BinaryIO, Literal
from urllib.parse import urlparse

from pydantic import BaseModel, ConfigDict, Field, model_validator

from rollwire.core.errors import ConfigError, RollwireError

logger = logging.getLogger(__name__)

_S3_BUSY = {"ServiceUnavailable", "SlowDown", "InternalError", "RequestTimeout"}
"""S3 answers that mean "not now" (the server restarting, throttling), worth asking again."""


class ObjectStoreError(RollwireError):
    """An object could not be read or written; the message names it."""


class ObjectNotFoundError(ObjectStoreError):
    """The object does not exist."""


class ObjectStore(ABC):
    """Stores bytes under keys."""

    @abstractmethod
    def put_file(self, key: str, path: Path) -> None:
        """Uploads the file at `path` as `key`."""

    @abstractmethod
    def get_file(self, key: str, path: Path) -> None:
        """Downloads `key` to `path`; raises `ObjectNotFoundError`."""

    @abstractmethod
    def stream(self, key: str, chunk_bytes: int = 1 << 20) -> Iterator[bytes]:
        """The bytes of `key` in chunks of at most `chunk_bytes`, as they arrive (hash or write
        them on the way); raises `ObjectNotFoundError` before the first chunk."""

    @abstractmethod
    def put_bytes(self, key: str, data: bytes) -> None:
        """Stores `data` as `key`."""

    @abstractmethod
    def get_bytes(self, key: str) -> bytes:
        """The bytes of `key`; raises `ObjectNotFoundError`."""

    @abstractmethod
    def exists(self, key: str) -> bool:
        """Whether `key` exists."""

    @abstractmethod
    def list(self, prefix: str) -> list[str]:
        """Keys under `prefix`, sorted."""

    @abstractmethod
    def delete(self, key: str) -> None:
        """Removes `key` (absent keys are fine)."""

    @abstractmethod
    def uri(self, key: str) -> str:
        """The URI of `key`, e.g. `s3://bucket/key` or `file:///root/key`."""

    @abstractmethod
    def key(self, uri: str) -> str:
        """The key of a URI of this store; raises `ConfigError` for a URI of another store."""


def _chunks(source: BinaryIO, chunk_bytes: int) -> Iterator[bytes]:
    with source:
        while chunk := source.read(chunk_bytes):
            yield chunk


def _check_key(key: str) -> str:
    parts = key.split("/")
    if not key or key.startswith("/") or any(p in ("", ".", "..") for p in parts[:-1]) or parts[-1] in (".", ".."):
        raise ObjectStoreError(f"object key {key!r} is invalid: use a relative path without '.' or '..' parts")
    return key


class LocalStore(ObjectStore):
    """A directory on this machine."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root).resolve()
        self.root.mkdir(parents=True, exist_ok=True)

    def _path(self, key: str) -> Path:
        return self.root / _check_key(key)

    def _partial(self, target: Path) -> tuple[int, str]:
        """A new temporary file beside `target`, in its folder (made again if a delete just took it empty)."""
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            return tempfile.mkstemp(dir=target.parent, prefix=".partial-")
        except FileNotFoundError:  # the folder went empty between the two: once more
            target.parent.mkdir(parents=True, exist_ok=True)
            return tempfile.mkstemp(dir=target.parent, prefix=".partial-")

    def put_file(self, key: str, path: Path) -> None:
        target = self._path(key)
        fd, tmp = self._partial(target)
        os.close(fd)
        shutil.copyfile(path, tmp)
        os.replace(tmp, target)

    def put_bytes(self, key: str, data: bytes) -> None:
        target = self._path(key)
        fd, tmp = self._partial(target)
        with os.fdopen(fd, "wb") as out:
            out.write(data)
        os.replace(tmp, target)

    def get_file(self, key: str, path: Path) -> None:
        source = self._path(key)
        if not source.is_file():
            raise ObjectNotFoundError(f"{self.uri(key)} does not exist")
        shutil.copyfile(source, path)

    def get_bytes(self, key: str) -> bytes:
        source = self._path(key)
        if not source.is_file():
            raise ObjectNotFoundError(f"{self.uri(key)} does not exist")
        return source.read_bytes()

    def stream(self, key: str, chunk_bytes: int = 1 << 20) -> Iterator[bytes]:
        try:
            source = open(self._path(key), "rb")
        except (FileNotFoundError, IsADirectoryError):
            raise ObjectNotFoundError(f"{self.uri(key)} does not exist") from None
        return _chunks(source, chunk_bytes)

    def exists(self, key: str) -> bool:
        return self._path(key).is_file()

    def list(self, prefix: str) -> list[str]:
        # Walks only the folders a key under `prefix` can be in: listing `policy/v00000042/` reads
        # that version's folder, not every version's, and `policy/v` reads the versions kept.
        keys: list[str] = []
        pending = [""]
        while pending:
            folder = pending.pop()
            try:
                entries = os.scandir(self.root / folder)
            except (FileNotFoundError, NotADirectoryError):
                continue
            with entries:
                for entry in entries:
                    key = f"{folder}{entry.name}"
                    if entry.is_dir(follow_symlinks=False):
                        if key.startswith(prefix) or prefix.startswith(key + "/"):
                            pending.append(key + "/")
                    elif key.startswith(prefix) and not entry.name.startswith(".partial-"):
                        keys.append(key)
        return sorted(keys)

    def delete(self, key: str) -> None:
        path = self._path(key)
        path.unlink(missing_ok=True)
        # An object store has no empty folders: a folder left empty goes too, or every pruned
        # version would stay a folder that each later listing walks.
        for folder in path.parents:
            if folder == self.root or not folder.is_relative_to(self.root):
                break
            try:
                folder.rmdir()
            except OSError:  # not empty (or already gone, or a writer just made it)
                break

    def uri(self, key: str) -> str:
        return (self.root / key).as_uri()

    def key(self, uri: str) -> str:
        parsed = urlparse(uri)
        path = Path(parsed.path)
        if parsed.scheme != "file" or not path.is_relative_to(self.root):
            raise ConfigError(f"{uri} is not inside this local store ({self.root.as_uri()})")
        return path.relative_to(self.root).as_posix() + ("/" if uri.endswith("/") else "")


class S3Store(ObjectStore):
    """A bucket on an S3-compatible server, through the `minio` client."""

    def __init__(self, endpoint: str, bucket: str, *, access_key: str, secret_key: str, secure: bool = True,
                 region: str | None = None, create_bucket: bool = True, outage_s: float = 300.0) -> None:
        try:
            from minio import Minio
        except ImportError as exc:
            raise ConfigError("the S3 object store needs the `minio` package: pip install 'rollwire[objectstore]'") from exc
        self.bucket, self.outage_s = bucket, outage_s
        self._client = Minio(endpoint, access_key=access_key, secret_key=secret_key, secure=secure, region=region)
        if create_bucket and not self._call("checking", "", self._client.bucket_exists, bucket):
            self._call("creating", "", self._client.make_bucket, bucket)

    def _call(self, what: str, key: str, fn, *args, **kwargs):
        """`fn(*args)`, asked again while the server cannot be reached or says it is busy, for up to
        `outage_s` (every call here is idempotent: a put writes the same bytes to the same key)."""
        from minio.error import S3Error
        from urllib3.exceptions import HTTPError
        deadline, delay, waited_since = time.monotonic() + self.outage_s, 0.5, None
        while True:
            try:
                result = fn(*args, **kwargs)
            except S3Error as exc:
                if exc.code in ("NoSuchKey", "NoSuchObject"):
                    raise ObjectNotFoundError(f"{self.uri(key)} does not exist") from exc
                if exc.code not in _S3_BUSY or time.monotonic() + delay > deadline:
                    raise ObjectStoreError(f"{what} {self.uri(key)} failed: {exc.code}: {exc.message}") from exc
                why = f"{exc.code}: {exc.message}"
            except (HTTPError, OSError) as exc:
                if time.monotonic() + delay > deadline:
                    raise ObjectStoreError(f"{what} {self.uri(key)} failed: the S3 server was unreachable for "
                                           f"{self.outage_s:.0f} s ({type(exc).__name__}: {exc})") from exc
                why = f"{type(exc).__name__}: {exc}"
            else:
                if waited_since is not None:
                    logger.warning("the S3 server answers again after %.0f s", time.monotonic() - waited_since)
                return result
            if waited_since is None:
                waited_since = time.monotonic()
                logger.warning("%s %s: the S3 server cannot be reached (%s); asking again for up to %.0f s",
                               what, self.uri(key), why, self.outage_s)
            time.sleep(delay)
            delay = min(2 * delay, 5.0)

    def put_file(self, key: str, path: Path) -> None:
        self._call("uploading", key, self._client.fput_object, self.bucket, _check_key(key), str(path))

    def put_bytes(self, key: str, data: bytes) -> None:
        import io
        self._call("writing", key, self._client.put_object, self.bucket, _check_key(key), io.BytesIO(data), len(data))

    def get_file(self, key: str, path: Path) -> None:
        self._call("downloading", key, self._client.fget_object, self.bucket, _check_key(key), str(path))

    def get_bytes(self, key: str) -> bytes:
        response = self._call("reading", key, self._client.get_object, self.bucket, _check_key(key))
        try:
            return response.read()
        finally:
            response.close()
            response.release_conn()

    def stream(self, key: str, chunk_bytes: int = 1 << 20) -> Iterator[bytes]:
        response = self._call("reading", key, self._client.get_object, self.bucket, _check_key(key))
        return self._stream(key, response, chunk_bytes)

    def _stream(self, key: str, response, chunk_bytes: int) -> Iterator[bytes]:
        from urllib3.exceptions import HTTPError
        try:
            yield from response.stream(chunk_bytes)
        except HTTPError as exc:
            raise ObjectStoreError(f"reading {self.uri(key)} failed midway: {exc}") from exc
        finally:
            response.close()
            response.release_conn()

    def exists(self, key: str) -> bool:
        try:
            self._call("checking", key, self._client.stat_object, self.bucket, _check_key(key))
            return True
        except ObjectNotFoundError:
            return False

    def list(self, prefix: str) -> list[str]:
        objects = self._call("listing", prefix, lambda: list(self._client.list_objects(  # lazy: read it all here
            self.bucket, prefix=prefix, recursive=True)))
        return sorted(o.object_name for o in objects)

    def delete(self, key: str) -> None:
        self._call("deleting", key, self._client.remove_object, self.bucket, _check_key(key))

    def uri(self, key: str) -> str:
        return f"s3://{self.bucket}/{key}"

    def key(self, uri: str) -> str:
        parsed = urlparse(uri)
        if parsed.scheme != "s3" or parsed.netloc != self.bucket:
            raise ConfigError(f"{uri} is not in this store's bucket s3://{self.bucket}/")
        return parsed.path.lstrip("/")


class LocalStoreSettings(BaseModel):
    """Weights and payloads in a local directory (the embedded default)."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    type: Literal["local"] = "local"
    """`local`: a directory on this machine; `s3`: an S3-compatible server."""
    root: Path = Path("runs/default/store")
    """Directory of the store; created if missing."""


class S3StoreSettings(BaseModel):
    """An S3-compatible server (MinIO, SeaweedFS, AWS S3 …)."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    type: Literal["s3"] = "s3"
    """`s3`: an S3-compatible server; `local`: a directory."""
    endpoint: str = "127.0.0.1:8333"
    """`host:port` of the S3 API, without scheme."""
    bucket: str = "rollwire"
    """Bucket for weights and payloads; created if missing."""
    access_key_env: str = "AWS_ACCESS_KEY_ID"
    """Environment variable holding the access key id. Credentials never live in settings: a
    recipe's settings are written to `recipe.json` and passed between processes."""
    secret_key_env: str = "AWS_SECRET_ACCESS_KEY"
    """Environment variable holding the secret key."""
    access_key_file: Path | None = None
    """A file holding the access key id instead (e.g. a mounted secret); read when the store opens."""
    secret_key_file: Path | None = None
    """A file holding the secret key instead."""
    secure: bool = False
    """Use TLS (https)."""
    region: str | None = None
    """Bucket region, when the server needs one."""
    outage_s: float = Field(default=300.0, gt=0)
    """How long a request is asked again while the server cannot be reached or is busy (a
    restart): a trainer's publish waits that long, then fails with the reason."""

    @model_validator(mode="before")
    @classmethod
    def _no_inline_credentials(cls, data: Any) -> Any:
        if isinstance(data, dict) and {"access_key", "secret_key"} & set(data):
            raise ValueError("store credentials never go in settings (they would be written to recipe.json): set "
                             "$AWS_ACCESS_KEY_ID and $AWS_SECRET_ACCESS_KEY (or the variables access_key_env and "
                             "secret_key_env name), or access_key_file and secret_key_file")
        return data

    def credentials(self, environ: Mapping[str, str] = os.environ) -> tuple[str, str]:
        """`(access key id, secret key)` from the files or the environment; `ConfigError` names what to set."""
        return (_secret(self.access_key_file, self.access_key_env, environ, "access key id"),
                _secret(self.secret_key_file, self.secret_key_env, environ, "secret key"))


def _secret(path: Path | None, variable: str, environ: Mapping[str, str], what: str) -> str:
    if path is not None:
        try:
            value = path.read_text().strip()
        except OSError as exc:
            raise ConfigError(f"cannot read the S3 {what} from {path}: {exc.strerror}") from None
    else:
        value = environ.get(variable, "").strip()
    if not value:
        raise ConfigError(f"no S3 {what}: set ${variable}" + (f" or fill {path}" if path else ""))
    return value


StoreSettings = Annotated[LocalStoreSettings | S3StoreSettings, Field(discriminator="type")]


def open_store(settings: LocalStoreSettings | S3StoreSettings) -> ObjectStore:
    """Opens the object store the settings describe."""
    if settings.type == "s3":
        access_key, secret_key = settings.credentials()
        return S3Store(settings.endpoint, settings.bucket, access_key=access_key, secret_key=secret_key,
                       secure=settings.secure, region=settings.region, outage_s=settings.outage_s)
    return LocalStore(settings.root)
