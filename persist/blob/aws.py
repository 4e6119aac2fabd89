"""AWS plumbing shared by the S3 blob, the DynamoDB commit and the S3/DynamoDB writer locks.

This module owns three things and nothing else:

* **Options.** ``storage_options`` as users pass them (boto3 names such as ``endpoint_url`` and
  ``region_name``, or the deltalake / object_store upper-case names such as ``AWS_ENDPOINT_URL``
  and ``AWS_REGION``) are normalized into :class:`AwsOptions`; whatever is not about reaching
  AWS is handed back for the caller (``persist.blob.s3``) to interpret.
* **Clients.** :func:`client` builds a boto3 client with botocore's own retries *disabled*.
* **Errors and retries.** :func:`classify` sorts every botocore / OS failure into the persist
  error tree (:class:`~persist.errors.Determinate` vs :class:`~persist.errors.Indeterminate`,
  transient or not); :func:`call` retries with capped, jittered exponential backoff, and never
  re-sends a non-idempotent request whose first attempt may have landed.

Classification (``write`` means the request changes state)::

    what happened                                   read            write
    4xx (bad request, denied, missing bucket)       Determinate     Determinate        not retried
    throttled (429, 503 SlowDown, Throttling...)    Determinate     Determinate        retried
    409 ConditionalRequestConflict                  -               Determinate        retried
    other 5xx (InternalError ...)                   Determinate     Indeterminate      retried*
    could not connect / connect timeout             Determinate     Determinate        retried
    read timeout, connection reset, short body      Determinate     Indeterminate      retried*
    bad parameters (botocore validation)            InvalidUsage    InvalidUsage       not retried

    * only when the caller declares the request idempotent; otherwise the Indeterminate is
      raised at once so the caller can resolve it (read back what it wrote).
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

import boto3
import botocore.exceptions as bx
from botocore.config import Config

from persist.blob.options import option_bool, option_float, option_int
from persist.errors import (
    Determinate,
    ExternalError,
    Indeterminate,
    InvalidUsage,
    MissingResource,
    PersistError,
)

T = TypeVar("T")

#: A boto3 client. NB: typed ``Any`` on purpose: the service stubs (mypy-boto3-s3 ...) are not
#: a dependency, and botocore generates the methods at runtime.
Client = Any

AddressingStyle = Literal["auto", "path", "virtual"]


# -- options -----------------------------------------------------------------------------------

# Every accepted spelling (lower-cased) -> the canonical name. NB: object_store/deltalake keys
# arrive upper-case (AWS_REGION) and Spark lower-cases option keys, so matching is
# case-insensitive.
_ALIASES: dict[str, str] = {
    "endpoint_url": "endpoint_url",
    "endpoint": "endpoint_url",
    "aws_endpoint_url": "endpoint_url",
    "aws_endpoint": "endpoint_url",
    "aws_endpoint_url_s3": "endpoint_url",
    "dynamodb_endpoint_url": "dynamodb_endpoint_url",
    "aws_endpoint_url_dynamodb": "dynamodb_endpoint_url",
    "region_name": "region_name",
    "region": "region_name",
    "aws_region": "region_name",
    "aws_default_region": "region_name",
    "aws_access_key_id": "aws_access_key_id",
    "access_key_id": "aws_access_key_id",
    "aws_secret_access_key": "aws_secret_access_key",
    "secret_access_key": "aws_secret_access_key",
    "aws_session_token": "aws_session_token",
    "session_token": "aws_session_token",
    "aws_token": "aws_session_token",
    "profile_name": "profile_name",
    "aws_profile": "profile_name",
    "addressing_style": "addressing_style",
    "aws_virtual_hosted_style_request": "virtual_hosted_style_request",
    "aws_allow_http": "allow_http",
    "allow_http": "allow_http",
    "connect_timeout": "connect_timeout",
    "read_timeout": "read_timeout",
    "max_pool_connections": "max_pool_connections",
    "max_attempts": "max_attempts",
    "retry_base_delay": "retry_base_delay",
    "retry_max_delay": "retry_max_delay",
}


@dataclass(frozen=True)
class RetryPolicy:
    """Capped exponential backoff with jitter.

    Attempt ``n`` (0-based) sleeps between half and all of ``min(max_delay, base_delay * 2**n)``
    before the next try. NB: "equal jitter" rather than full jitter: a retry never fires at once,
    which matters against a throttling store, and racing retriers still spread out.
    """

    max_attempts: int = 6
    base_delay: float = 0.05
    max_delay: float = 2.0

    def delay(self, attempt: int) -> float:
        """Returns the seconds to sleep after failed attempt ``attempt`` (0-based)."""
        cap = min(self.max_delay, self.base_delay * 2.0**attempt)
        return cap / 2 + random.uniform(0, cap / 2)


@dataclass(frozen=True)
class AwsOptions:
    """How to reach AWS (or an S3/DynamoDB-compatible endpoint)."""

    endpoint_url: str | None = None
    #: Falls back to ``endpoint_url``; an empty string means AWS's own DynamoDB endpoint.
    dynamodb_endpoint_url: str | None = None
    region_name: str | None = None
    aws_access_key_id: str | None = None
    aws_secret_access_key: str | None = None
    aws_session_token: str | None = None
    profile_name: str | None = None
    addressing_style: AddressingStyle | None = None
    connect_timeout: float = 5.0
    read_timeout: float = 30.0
    max_pool_connections: int = 32
    retry: RetryPolicy = field(default_factory=RetryPolicy)

    @classmethod
    def split(cls, storage_options: Mapping[str, Any]) -> tuple[AwsOptions, dict[str, Any]]:
        """Takes the AWS connection settings out of ``storage_options``.

        Args:
            storage_options: user options; keys are matched case-insensitively.

        Returns:
            The connection settings, and the remaining options (keys lower-cased) for the caller.

        Raises:
            InvalidUsage: a value of the wrong type, or one key given twice in two spellings.
        """
        known: dict[str, Any] = {}
        rest: dict[str, Any] = {}
        for raw_key, value in storage_options.items():
            key = str(raw_key).lower()
            canon = _ALIASES.get(key)
            if canon is None:
                if key in rest:
                    raise InvalidUsage(f"storage option {raw_key!r} given twice")
                rest[key] = value
                continue
            if canon in known and known[canon] != value:
                raise InvalidUsage(f"storage option {canon!r} given twice with different values")
            known[canon] = value
        style = known.pop("addressing_style", None)
        if "virtual_hosted_style_request" in known:
            vh = option_bool("aws_virtual_hosted_style_request",
                             known.pop("virtual_hosted_style_request"))
            style = style or ("virtual" if vh else "path")
        if style is not None and style not in ("auto", "path", "virtual"):
            raise InvalidUsage(f"addressing_style must be auto, path or virtual, not {style!r}")
        # NB: accepted for deltalake compatibility; boto3 takes http vs https from the URL.
        known.pop("allow_http", None)
        retry = RetryPolicy(
            max_attempts=option_int("max_attempts", known.pop("max_attempts", 6)),
            base_delay=option_float("retry_base_delay", known.pop("retry_base_delay", 0.05)),
            max_delay=option_float("retry_max_delay", known.pop("retry_max_delay", 2.0)),
        )
        if retry.max_attempts < 1:
            raise InvalidUsage("max_attempts must be at least 1")
        opts = cls(
            endpoint_url=known.get("endpoint_url") or None,
            dynamodb_endpoint_url=known.get("dynamodb_endpoint_url"),
            region_name=known.get("region_name") or None,
            aws_access_key_id=known.get("aws_access_key_id"),
            aws_secret_access_key=known.get("aws_secret_access_key"),
            aws_session_token=known.get("aws_session_token"),
            profile_name=known.get("profile_name"),
            addressing_style=style,
            connect_timeout=option_float("connect_timeout",
                                         known.get("connect_timeout", cls.connect_timeout)),
            read_timeout=option_float("read_timeout", known.get("read_timeout", cls.read_timeout)),
            max_pool_connections=option_int("max_pool_connections",
                                            known.get("max_pool_connections",
                                                      cls.max_pool_connections)),
            retry=retry,
        )
        return opts, rest


def client(
    service: Literal["s3", "dynamodb"],
    options: AwsOptions,
    *,
    connect_timeout: float | None = None,
    read_timeout: float | None = None,
) -> Client:
    """Builds a boto3 client for ``service``.

    Args:
        service: ``"s3"`` or ``"dynamodb"``.
        options: connection settings.
        connect_timeout: overrides ``options.connect_timeout`` (seconds).
        read_timeout: overrides ``options.read_timeout`` (seconds).

    Returns:
        A thread-safe boto3 client.

    Raises:
        InvalidUsage: the settings are rejected by boto3 (an unknown profile, a bad endpoint).
    """
    # NB: botocore's retries are turned off (total_max_attempts=1). Its standard mode re-sends a
    # request after a read timeout or a 5xx, which for ``put_object(IfNoneMatch="*")`` turns "my
    # create landed but the answer was lost" into a 412 and a wrong "someone else won". Retrying
    # here, in :func:`call`, is done knowing whether the request is idempotent.
    config = Config(
        connect_timeout=connect_timeout if connect_timeout is not None else options.connect_timeout,
        read_timeout=read_timeout if read_timeout is not None else options.read_timeout,
        retries={"total_max_attempts": 1, "mode": "standard"},
        max_pool_connections=options.max_pool_connections,
        s3={"addressing_style": options.addressing_style} if options.addressing_style else None,
    )
    endpoint = options.endpoint_url
    if service == "dynamodb" and options.dynamodb_endpoint_url is not None:
        endpoint = options.dynamodb_endpoint_url or None
    try:
        with _SESSIONS_LOCK:
            session = _session(options)
            # NB: S3 works without a region but DynamoDB does not; us-east-1 is what every
            # S3-compatible store (and moto) accepts when none was configured anywhere.
            region = session.region_name or "us-east-1"
            return session.client(service, endpoint_url=endpoint, region_name=region,
                                  config=config)
    except (bx.BotoCoreError, ValueError) as e:
        raise InvalidUsage(f"cannot build a {service} client from storage_options: {e}") from e


# NB: building a session loads botocore's service models from disk (~100 ms per client); one
# session per set of credentials caches them, so later clients cost a few ms. boto3 sessions are
# not thread-safe, hence the lock around every use; the clients they make are.
_SESSIONS: dict[tuple[str | None, ...], Any] = {}
_SESSIONS_LOCK = threading.Lock()


def _session(options: AwsOptions) -> Any:
    key = (options.aws_access_key_id, options.aws_secret_access_key, options.aws_session_token,
           options.region_name, options.profile_name)
    session = _SESSIONS.get(key)
    if session is None:
        session = boto3.session.Session(
            aws_access_key_id=options.aws_access_key_id,
            aws_secret_access_key=options.aws_secret_access_key,
            aws_session_token=options.aws_session_token,
            region_name=options.region_name,
            profile_name=options.profile_name,
        )
        _SESSIONS[key] = session
    return session


# -- errors ------------------------------------------------------------------------------------

_THROTTLED = frozenset({
    "SlowDown", "Throttling", "ThrottlingException", "ThrottledException",
    "TooManyRequestsException", "RequestLimitExceeded", "ProvisionedThroughputExceededException",
    "RequestThrottled", "RequestThrottledException", "LimitExceededException",
    "TransactionInProgressException",
})
# Rejected before anything happened, and worth trying again.
_TRANSIENT_4XX = frozenset({
    "ConditionalRequestConflict",  # S3: a concurrent conditional write on the key; retry
    "RequestTimeout",  # S3: the socket did not deliver the body in time; nothing written
    "RequestTimeoutException",
    "PriorRequestNotComplete",
    "OperationAborted",
    "TransactionConflictException",
})
_MISSING = frozenset({"NoSuchBucket", "ResourceNotFoundException"})
_CREDENTIALS = frozenset({
    "InvalidAccessKeyId", "SignatureDoesNotMatch", "AccessDenied", "ExpiredToken",
    "UnrecognizedClientException", "InvalidClientTokenId", "AccessDeniedException",
    "InvalidToken", "MissingAuthenticationToken", "AllAccessDisabled",
})


@dataclass(frozen=True)
class Failure:
    """A botocore/OS failure sorted into the persist tree."""

    #: The persist error to raise (its ``__cause__`` is set by the raiser).
    error: PersistError
    #: True if trying again may succeed.
    transient: bool


def error_code(e: BaseException) -> tuple[str, int]:
    """Returns ``(code, http status)`` of a botocore ClientError, else ``("", 0)``."""
    if isinstance(e, bx.ClientError):
        response: Mapping[str, Any] = getattr(e, "response", None) or {}
        code = str(response.get("Error", {}).get("Code", ""))
        status = int(response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
        return code, status
    return "", 0


def denied(e: BaseException | None) -> bool:
    """Whether ``e`` is a 401/403 answer (credentials, permissions, or a store's missing bucket)."""
    code, status = error_code(e) if e is not None else ("", 0)
    return code in _CREDENTIALS or status in (401, 403)


def bucket_missing(client: Any, bucket: str) -> bool:
    """One ``HeadBucket``: True only if the store says bucket ``bucket`` does not exist (404).

    NB: for telling a missing bucket from a refusal after a 403. SeaweedFS answers a PUT to a
    missing bucket with 403 AccessDenied, while AWS, moto and ministack say 404 NoSuchBucket.
    Any failure of the probe itself counts as "not known to be missing".
    """
    try:
        client.head_bucket(Bucket=bucket)
    except AWS_ERRORS as e:
        code, status = error_code(e)
        return status == 404 or code == "NoSuchBucket"
    return False


def get_object(client: Any, bucket: str, key: str, *, byte_range: str | None = None
               ) -> tuple[bytes, str] | None:
    """One GET of ``s3://bucket/key``: ``(body, ETag)``, or None if there is no such object.

    Args:
        byte_range: an HTTP ``Range`` (``bytes=100-``, ``bytes=100-199``): only those bytes;
            empty (ETag ``""``) when the range starts past the object's end.

    Raises the botocore error for anything else (a missing *bucket* too): wrap the call in
    :func:`call` for retries and the persist error tree.
    """
    try:
        if byte_range is None:
            response = client.get_object(Bucket=bucket, Key=key)
        else:
            response = client.get_object(Bucket=bucket, Key=key, Range=byte_range)
    except AWS_ERRORS as e:
        code, status = error_code(e)
        if code == "NoSuchKey" or (status == 404 and code != "NoSuchBucket"):
            return None
        if byte_range is not None and (code == "InvalidRange" or status == 416):
            return b"", ""  # NB: S3 refuses a range that starts at or past the end
        raise
    body = response["Body"]
    try:
        data: bytes = body.read()
    finally:
        body.close()
    return data, str(response["ETag"])


def classify(e: BaseException, what: str, *, write: bool) -> Failure:
    """Sorts ``e`` into the persist error tree (see the module table).

    Args:
        e: the exception botocore (or the socket layer) raised.
        what: a short description of the operation, for the message (``"put s3://b/k"``).
        write: True if the request changes state (then an ambiguous failure is Indeterminate).

    Returns:
        The error to raise and whether retrying may help.
    """
    maybe = Indeterminate if write else Determinate
    if isinstance(e, bx.ClientError):
        code, status = error_code(e)
        detail = f"{what}: {code or status} {e}"
        if code in _MISSING:
            return Failure(MissingResource(f"{what}: {e}"), transient=False)
        if code in _THROTTLED or status == 429:
            return Failure(Determinate(f"{detail} (throttled)"), transient=True)
        if code in _TRANSIENT_4XX:
            return Failure(Determinate(detail), transient=True)
        if code in _CREDENTIALS or status in (401, 403):
            # NB: some S3-compatible stores (SeaweedFS) answer a write to a missing bucket with
            # 403 AccessDenied, not 404 NoSuchBucket; S3Blob tells the two apart (bucket_missing).
            return Failure(Determinate(f"{detail} (check credentials and permissions, and that "
                                       f"the bucket exists)"), False)
        if status >= 500:
            # NB: AWS documents that a 500/503 on a write may or may not have been applied.
            return Failure(maybe(detail), transient=True)
        return Failure(Determinate(detail), transient=False)
    if isinstance(e, bx.ParamValidationError):
        return Failure(InvalidUsage(f"{what}: {e}"), transient=False)
    if isinstance(e, (bx.NoCredentialsError, bx.PartialCredentialsError, bx.NoRegionError)):
        return Failure(Determinate(f"{what}: {e} (configure credentials/region)"), False)
    # NB: connection errors (refused, DNS, connect timeout, proxy, TLS handshake) happen before
    # the request is sent: nothing can have landed.
    if isinstance(e, bx.ConnectionError):
        return Failure(Determinate(f"{what}: {e}"), transient=True)
    if isinstance(e, (bx.HTTPClientError, bx.IncompleteReadError, OSError)):
        return Failure(maybe(f"{what}: {e}"), transient=True)
    if isinstance(e, bx.BotoCoreError):
        return Failure(maybe(f"{what}: {e}"), transient=False)
    return Failure(maybe(f"{what}: {type(e).__name__}: {e}"), transient=False)


#: What :func:`call` catches and translates; anything else (persist errors included) passes.
AWS_ERRORS: tuple[type[BaseException], ...] = (bx.ClientError, bx.BotoCoreError, OSError)


def call(
    fn: Callable[[], T],
    *,
    what: str,
    write: bool,
    idempotent: bool,
    retry: RetryPolicy,
    deadline: float | None = None,
) -> T:
    """Runs ``fn`` (one AWS request), retrying transient failures with jittered backoff.

    Args:
        fn: makes the request; may raise botocore/OS errors, which are translated here.
        what: a short description for error messages.
        write: the request changes state.
        idempotent: sending it twice has the effect of sending it once. A non-idempotent write
            (a conditional create) is retried only after failures that prove nothing happened.
        retry: the backoff policy.
        deadline: a ``time.monotonic()`` instant after which no new attempt is started.

    Returns:
        Whatever ``fn`` returns.

    Raises:
        Determinate: definitely failed (after retries, or not worth retrying).
        Indeterminate: a write may have landed; not retried if ``idempotent`` is False.
        InvalidUsage: botocore refused the parameters.
    """
    attempt = 0
    while True:
        try:
            return fn()
        except AWS_ERRORS as e:
            failure = classify(e, what, write=write)
            definite = not isinstance(failure.error, Indeterminate)
            again = failure.transient and (idempotent or definite)
            attempt += 1
            pause = retry.delay(attempt - 1)
            late = deadline is not None and time.monotonic() + pause >= deadline
            if not again or attempt >= retry.max_attempts or late:
                if isinstance(failure.error, ExternalError) and attempt > 1:
                    failure.error.args = (f"{failure.error.args[0]} (after {attempt} attempts)",)
                raise failure.error from e
            time.sleep(pause)


__all__ = [
    "AWS_ERRORS",
    "AwsOptions",
    "Client",
    "Failure",
    "MissingResource",
    "RetryPolicy",
    "bucket_missing",
    "call",
    "classify",
    "client",
    "denied",
    "error_code",
]
