"""One set of S3 settings for persist and for Hadoop's S3A connector (Spark's reader of
``s3a://``), and S3A's failures as persist's errors.

A user configures an ``s3://`` location once, with persist's ``storage_options`` (boto3's
names or the ``AWS_*`` ones, :class:`persist.blob.aws.AwsOptions`). An engine whose own reader
reaches the same objects through S3A gets the same settings as Hadoop configuration keys from
:func:`hadoop_options`; Spark passes a file source's ``fs.s3a.*`` options into that read's
Hadoop configuration, so they apply per read and need no session setting. Which storage option
becomes which Hadoop key is the engine's rule, kept here; the engine's glue only hands the
options to its reader, leaving out any key the user set on the session (the user's own setting
wins).

When S3A fails, :func:`s3a_failure` turns the Java exception classes of the failure's cause
chain (never its message text) into persist's typed error, whose message names the setting to
fix.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from typing import Any

from persist.errors import Determinate, InvalidUsage, PersistError

#: S3A's credentials provider for keys given in the configuration (with and without a session
#: token).
SIMPLE = "org.apache.hadoop.fs.s3a.SimpleAWSCredentialsProvider"
TEMPORARY = "org.apache.hadoop.fs.s3a.TemporaryAWSCredentialsProvider"

#: Which storage option each Hadoop key comes from (for messages naming the setting to fix).
SOURCES: dict[str, str] = {
    "fs.s3a.endpoint": "endpoint_url",
    "fs.s3a.connection.ssl.enabled": "endpoint_url",
    "fs.s3a.endpoint.region": "region_name",
    "fs.s3a.path.style.access": "addressing_style",
    "fs.s3a.access.key": "aws_access_key_id",
    "fs.s3a.secret.key": "aws_secret_access_key",
    "fs.s3a.session.token": "aws_session_token",
    "fs.s3a.aws.credentials.provider": "aws_access_key_id",
    "fs.s3a.connection.establish.timeout": "connect_timeout",
    "fs.s3a.connection.timeout": "read_timeout",
}

def hadoop_options(url: str, storage_options: Mapping[str, Any] | None) -> dict[str, str]:
    """The Hadoop configuration keys (``fs.s3a.*``) that make S3A reach location ``url`` as
    persist does with ``storage_options``; empty for a location that is not ``s3://``.

    ===============================  ==============================================
    storage option                   Hadoop key
    ===============================  ==============================================
    ``endpoint_url``                 ``fs.s3a.endpoint`` (and
                                     ``fs.s3a.connection.ssl.enabled`` false for
                                     ``http://``)
    ``region_name``                  ``fs.s3a.endpoint.region``
    ``addressing_style``             ``fs.s3a.path.style.access`` (``path``: true,
                                     ``virtual``: false)
    ``aws_access_key_id``,           ``fs.s3a.access.key``, ``fs.s3a.secret.key``,
    ``aws_secret_access_key``        ``fs.s3a.aws.credentials.provider`` (S3A's
    (``aws_session_token``)          simple provider; temporary with a token,
                                     ``fs.s3a.session.token``)
    ``connect_timeout``,             ``fs.s3a.connection.establish.timeout``,
    ``read_timeout``                 ``fs.s3a.connection.timeout`` (milliseconds)
    ===============================  ==============================================

    Options given in any spelling persist accepts (``AWS_ENDPOINT_URL``, ``region``, ...);
    with no endpoint among them, the environment's ``AWS_ENDPOINT_URL_S3`` or
    ``AWS_ENDPOINT_URL``, as boto3 takes it.
    Not mapped: ``profile_name`` (S3A's default credentials chain reads ``AWS_PROFILE``) and
    persist's own options (caching, commit modes, DynamoDB), which a reader does not use. With
    no credentials in ``storage_options`` the provider is left to S3A (its default chain:
    environment, profile, instance role), as boto3 does.

    Raises:
        InvalidUsage: ``storage_options`` is malformed (as persist's own S3 store says).
    """
    if not url.startswith(("s3://", "s3a://")):
        return {}
    # NB: imported here: persist.blob.aws needs boto3 (the 's3' extra), which a core install
    # lacks, and only an s3:// read gets this far.
    try:
        from persist.blob import aws
    except ImportError as e:  # pragma: no cover - depends on the installed extras
        raise InvalidUsage(f"s3:// locations need the 's3' extra (boto3): {e}") from e
    opts, _ = aws.AwsOptions.split(storage_options or {})
    out: dict[str, str] = {}
    # NB: boto3 (persist's client) takes the endpoint from the environment when no option
    # names it, S3A does not: the same rule here, so that both reach the same store.
    endpoint = opts.endpoint_url or os.environ.get("AWS_ENDPOINT_URL_S3") \
        or os.environ.get("AWS_ENDPOINT_URL")
    if endpoint:
        out["fs.s3a.endpoint"] = endpoint
        out["fs.s3a.connection.ssl.enabled"] = str(
            not endpoint.lower().startswith("http://")).lower()
    if opts.region_name:
        out["fs.s3a.endpoint.region"] = opts.region_name
    if opts.addressing_style in ("path", "virtual"):
        out["fs.s3a.path.style.access"] = str(opts.addressing_style == "path").lower()
    if opts.aws_access_key_id or opts.aws_secret_access_key:
        out["fs.s3a.access.key"] = opts.aws_access_key_id or ""
        out["fs.s3a.secret.key"] = opts.aws_secret_access_key or ""
        if opts.aws_session_token:
            out["fs.s3a.session.token"] = opts.aws_session_token
        out["fs.s3a.aws.credentials.provider"] = TEMPORARY if opts.aws_session_token \
            else SIMPLE
    defaults = aws.AwsOptions()
    if opts.connect_timeout != defaults.connect_timeout:
        out["fs.s3a.connection.establish.timeout"] = str(int(opts.connect_timeout * 1000))
    if opts.read_timeout != defaults.read_timeout:
        out["fs.s3a.connection.timeout"] = str(int(opts.read_timeout * 1000))
    return out


# -- failures ---------------------------------------------------------------------------------

_NO_CONNECTOR = frozenset({
    "java.lang.ClassNotFoundException", "java.lang.NoClassDefFoundError",
    "org.apache.hadoop.fs.UnsupportedFileSystemException",
})
_CREDENTIALS = frozenset({
    "org.apache.hadoop.fs.s3a.auth.NoAuthWithAWSException",
    "org.apache.hadoop.fs.s3a.CredentialInitializationException",
    "java.nio.file.AccessDeniedException",
})
_ENDPOINT = frozenset({
    "java.net.ConnectException", "java.net.UnknownHostException",
    "java.net.NoRouteToHostException", "java.net.SocketTimeoutException",
    "org.apache.hadoop.net.ConnectTimeoutException",
    "org.apache.hadoop.fs.s3a.AWSApiCallTimeoutException",
    "javax.net.ssl.SSLException", "javax.net.ssl.SSLHandshakeException",
    "org.apache.http.conn.HttpHostConnectException",
    "org.apache.http.conn.ConnectTimeoutException",
})
_NO_BUCKET = frozenset({"org.apache.hadoop.fs.s3a.UnknownStoreException"})


def _hint(names: Iterable[str], settings: Mapping[str, str]) -> str:
    """``storage option (Hadoop key: value or unset), ...`` for ``names``."""
    return ", ".join(f"{SOURCES.get(k, k)} ({k}: {settings.get(k, 'unset')!s:.80})"
                     for k in names)


def s3a_failure(url: str, classes: Iterable[str], settings: Mapping[str, str],
                detail: str = "") -> PersistError | None:
    """persist's error for S3A's failure to reach location ``url``, from the Java class names
    of the failure's cause chain (outermost first), or None when the failure is not one of
    reaching S3 (a missing file is the read's own business: it may be a part GC removed).

    Its message comes first and names the storage option to fix (and the Hadoop key it
    became, with the value the read used, from ``settings``); ``detail`` (Spark's first line)
    is appended.

    * the connector is missing (``S3AFileSystem`` not found, no file system for ``s3a``):
      ``InvalidUsage`` naming the JARs;
    * credentials (no credentials, refused, access denied): ``Determinate`` naming
      ``aws_access_key_id`` / ``aws_secret_access_key``;
    * the endpoint (refused, unknown host, timeouts, TLS): ``Determinate`` naming
      ``endpoint_url``;
    * the bucket does not exist there: ``Determinate`` naming the URL and ``endpoint_url``.
    """
    seen = set(classes)
    tail = f" (S3A said: {detail[:300]})" if detail else ""
    if seen & _NO_CONNECTOR:
        return InvalidUsage(
            f"this Spark cannot read s3a:// (Hadoop's S3A connector, hadoop-aws and the AWS "
            f"SDK bundle at Spark's Hadoop version, is not on its classpath: add them to "
            f"spark.jars, see docs/spark.md, 'The native path on S3'); or read through the "
            f"Python source instead: spark.read.format(\"persist\").option(\"collection\", "
            f"...).load(url){tail}")
    if seen & _CREDENTIALS:
        return Determinate(
            f"S3A could not authenticate to {url}: set storage_options aws_access_key_id and "
            f"aws_secret_access_key (and aws_session_token for temporary credentials) to "
            f"credentials this store accepts; the read used "
            f"{_hint(('fs.s3a.access.key', 'fs.s3a.aws.credentials.provider'), settings)}"
            f"{tail}")
    if seen & _ENDPOINT:
        return Determinate(
            f"S3A could not reach the store of {url}: set storage_options endpoint_url to the "
            f"store's URL (and region_name); the read used "
            f"{_hint(('fs.s3a.endpoint', 'fs.s3a.endpoint.region'), settings)}{tail}")
    if seen & _NO_BUCKET:
        return Determinate(
            f"S3A found no bucket of {url} at its endpoint: check the URL's bucket and "
            f"storage_options endpoint_url; the read used "
            f"{_hint(('fs.s3a.endpoint',), settings)}{tail}")
    return None


__all__ = ["SOURCES", "hadoop_options", "s3a_failure"]
