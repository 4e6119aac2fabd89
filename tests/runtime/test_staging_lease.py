"""Staging leases (``persist.indexed.state.lease``): parts staged by another process survive every
leaked-blob sweep while their job's lease lives, however long that is; once it lapses they are
revoked, reclaimed after the grace, and can no longer be committed."""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import pyarrow as pa
import pytest

import persist
from persist import layout
from persist.blob.file import FileBlob
from persist.errors import Determinate, InvalidUsage
from persist.indexed.format import write
from persist.indexed.format.columnar import from_updates
from persist.indexed.format.evolve import Types
from persist.indexed.format.meta import PartMeta
from persist.indexed.maintenance import gc, verify
from persist.indexed.state import lease


def _stage(blob: FileBlob, client: persist.Client, name: str, rows: list[tuple[object, ...]],
           lease_id: str) -> PartMeta:
    """Stores ``rows`` as a part staged under ``lease_id``, as a Spark task does (its own
    blob handle, the lease renewed first)."""
    c = client.state.collections[name]
    types = Types.of(c)
    table = from_updates(rows, types.schema, types.key, types.value)
    lease.renew(blob, lease_id, ttl_seconds=30)
    return write.new_part(blob, c, table, inline_threshold=0, consolidated=False,
                          lease_id=lease_id)


def test_a_lease_lives_until_it_lapses_and_revocation_is_final(tmp_path: Path) -> None:
    blob = FileBlob(tmp_path)
    lid = lease.take(blob, job="nightly load", ttl_seconds=0.2)
    rec = lease.read(blob, lid)
    assert rec is not None
    assert rec.job == "nightly load"
    assert rec.id == lid
    # NB: judged at chosen instants of the clock, not after sleeps: a loaded machine took
    # longer than the 0.2 s lease between taking it and the first check
    skew_ms = 50
    for now, want in ((rec.expires_wall_ms - 150, lease.LeaseState.LIVE),
                      (rec.expires_wall_ms + skew_ms, lease.LeaseState.LIVE),
                      (rec.expires_wall_ms + skew_ms + 1, lease.LeaseState.LAPSED)):
        assert lease.state(blob, lid, now_ms=now, skew_seconds=skew_ms / 1000) is want
    time.sleep(0.35)  # and by the real clock, once its time has passed
    assert lease.state(blob, lid, skew_seconds=0.05) is lease.LeaseState.LAPSED
    lease.renew(blob, lid, ttl_seconds=10)  # a lapsed lease not yet revoked may be renewed
    assert lease.state(blob, lid, skew_seconds=0.05) is lease.LeaseState.LIVE
    lease.revoke(blob, lid)
    lease.revoke(blob, lid)  # idempotent
    assert lease.state(blob, lid) is lease.LeaseState.REVOKED
    with pytest.raises(lease.LeaseRevoked, match="revoked"):
        lease.renew(blob, lid)
    with pytest.raises(lease.LeaseRevoked, match="cannot be committed"):
        lease.check_committable(blob, {lid})
    assert isinstance(lease.LeaseRevoked("x"), Determinate)


def test_a_released_lease_cannot_be_renewed_or_committed_from(tmp_path: Path) -> None:
    blob = FileBlob(tmp_path)
    lid = lease.take(blob)
    lease.check_committable(blob, {lid})
    lease.release(blob, lid)
    assert lease.read(blob, lid) is None
    with pytest.raises(lease.LeaseRevoked):
        lease.renew(blob, lid)
    with pytest.raises(lease.LeaseRevoked):
        lease.check_committable(blob, {lid})
    never = uuid.uuid4().hex  # an id nobody took: nothing may be committed under it either
    with pytest.raises(lease.LeaseRevoked):
        lease.check_committable(blob, {never})


@pytest.mark.parametrize("bad", ["short", "G" * 32, 7, None])
def test_malformed_lease_ids_and_ttls_are_refused(tmp_path: Path, bad: object) -> None:
    blob = FileBlob(tmp_path)
    with pytest.raises(InvalidUsage, match="lease id"):
        lease.renew(blob, bad)  # type: ignore[arg-type]
    with pytest.raises(InvalidUsage, match="ttl_seconds"):
        lease.take(blob, ttl_seconds=0)
    with pytest.raises(InvalidUsage, match="ttl_seconds"):
        lease.take(blob, ttl_seconds=True)


def test_part_ids_name_their_lease(tmp_path: Path) -> None:
    lid = uuid.uuid4().hex
    key = layout.data_key(3, layout.staged_part_id(lid))
    assert layout.is_staged(key)
    assert layout.lease_of(key) == lid
    assert layout.lease_of(layout.data_key(3, layout.STAGED_PART_PREFIX + uuid.uuid4().hex)) \
        is None  # staged by an older sink, without a lease
    assert layout.lease_of(layout.data_key(3, uuid.uuid4().hex)) is None


def test_files_in_a_staging_directory_belong_to_its_lease(tmp_path: Path) -> None:
    lid = uuid.uuid4().hex
    d = layout.staged_dir(3, lid)
    assert d.startswith("data/3/staged-")
    assert d.endswith("/")
    # whatever another engine's writer names its files, temporary ones included
    for name in ("part-00000-x.zstd.parquet", ".part-0.crc", "_temporary/0/task/part-0"):
        assert layout.is_staged(d + name)
        assert layout.lease_of(d + name) == lid
    assert layout.lease_of(f"data/3/{uuid.uuid4().hex}/part-0.parquet") is None
    assert not layout.is_staged(f"data/3/{uuid.uuid4().hex}/part-0.parquet")
    assert not layout.is_staged("meta/staged-x/y")
    # the sweep spares them while the lease lives and reclaims them once it is revoked
    loc = tmp_path / "loc"
    with persist.open(str(loc)) as client:
        client.create_or_load("c", key_type=pa.string(), value_type=pa.int64())
        blob = FileBlob(loc)
        live = lease.take(blob, ttl_seconds=30)
        keys = [layout.staged_dir(1, live) + n for n in ("part-0.parquet", "_temporary/0/x")]
        for k in keys:
            blob.set_plain(k, b"spark wrote this")
        sweeper = gc.LeakSweeper(grace_seconds=5.0, lease_skew_seconds=0.05)
        newest = lambda: client.state  # noqa: E731
        now = time.monotonic()
        assert sweeper.sweep(blob, newest, now) == []
        assert sweeper.sweep(blob, newest, now + 3600) == []
        lease.revoke(blob, live)
        assert sweeper.sweep(blob, newest, now + 7200) == []  # its grace starts
        assert sorted(sweeper.sweep(blob, newest, now + 10_800)) == sorted(keys)


def test_the_sweep_spares_a_live_lease_and_reclaims_a_lapsed_one(tmp_path: Path) -> None:
    loc = tmp_path / "loc"
    with persist.open(str(loc)) as client:
        client.create_or_load("c", key_type=pa.string(), value_type=pa.int64())
        blob = FileBlob(loc)
        live = lease.take(blob, ttl_seconds=30)
        doomed = lease.take(blob, ttl_seconds=0.05)
        kept = _stage(blob, client, "c", [(("a", 1), 0, 1)], live)
        lost = write.new_part(blob, client.state.collections["c"],
                              from_updates([(("b", 1), 0, 1)], *_types(client)),
                              inline_threshold=0, consolidated=False, lease_id=doomed)
        old_style = write.new_part(blob, client.state.collections["c"],
                                   from_updates([(("c", 1), 0, 1)], *_types(client)),
                                   inline_threshold=0, consolidated=False, staged=True)
        time.sleep(0.2)  # the doomed lease's expiry (plus the sweep's skew) passes
        sweeper = gc.LeakSweeper(grace_seconds=5.0, lease_skew_seconds=0.05)
        newest = lambda: client.state  # noqa: E731
        now = time.monotonic()
        assert sweeper.sweep(blob, newest, now) == []
        # the sweep revoked the lapsed lease before starting the grace of its part
        assert lease.state(blob, doomed) is lease.LeaseState.REVOKED
        assert lease.state(blob, live) is lease.LeaseState.LIVE
        # an hour later (the grace long past): only the revoked lease's part goes
        deleted = sweeper.sweep(blob, newest, now + 3600)
        assert deleted == [lost.blob_key]
        assert _stored(blob, kept)
        assert _stored(blob, old_style)  # no lease: the operator's call
        # the live job commits its part; the revoked one cannot commit (its data may be gone)
        client.apply(parts={"c": [kept]}, seals={"c": 1}).result()
        _, r = client.create_or_load("c", key_type=pa.string(), value_type=pa.int64())
        assert r.snapshot(0).to_python() == [(("a", 1), 0, 1)]
        with pytest.raises(lease.LeaseRevoked, match="rerun the job"):
            client.apply(parts={"c": [lost]}, seals={"c": 2}).result()
        assert r.upper == 1
        assert r.snapshot(0).to_python() == [(("a", 1), 0, 1)]


def test_a_commit_after_revocation_is_refused_whatever_the_parts_state(tmp_path: Path) -> None:
    """Revoked between staging and commit (a sweep judged the job dead): nothing commits, even
    though the part is still stored."""
    loc = tmp_path / "loc"
    with persist.open(str(loc)) as client:
        _, r = client.create_or_load("c", key_type=pa.string(), value_type=pa.int64())
        blob = FileBlob(loc)
        lid = lease.take(blob)
        part = _stage(blob, client, "c", [(("a", 1), 0, 1)], lid)
        lease.revoke(blob, lid)
        assert _stored(blob, part)
        with pytest.raises(lease.LeaseRevoked):
            client.apply(parts={"c": [part]}, seals={"c": 1}).result()
        assert r.upper == 0
        assert client.state.collections["c"].parts == ()


def test_verify_delete_leaked_honours_leases(tmp_path: Path) -> None:
    loc = tmp_path / "loc"
    with persist.open(str(loc)) as client:
        client.create_or_load("c", key_type=pa.string(), value_type=pa.int64())
        blob = FileBlob(loc)
        live = lease.take(blob, ttl_seconds=30)
        gone = lease.take(blob)
        kept = _stage(blob, client, "c", [(("a", 1), 0, 1)], live)
        lost = _stage(blob, client, "c", [(("b", 1), 0, 1)], gone)
        lease.release(blob, gone)  # its job ended without committing this part
    report = verify.verify(blob.read_only())
    assert sorted(report.leaked) == sorted([kept.blob_key, lost.blob_key])
    said: list[str] = []
    deleted = verify.delete_leaked(blob, report.leaked, 0.05, said.append)
    assert deleted == [lost.blob_key]
    assert _stored(blob, kept)
    assert any("staging leases still alive" in s for s in said)


def _stored(blob: FileBlob, part: PartMeta) -> bool:
    """Whether ``part``'s blob is still there, verified (a Parquet part against its checksum)."""
    assert part.blob_key is not None
    if part.parquet:
        assert isinstance(part.checksum, int)
        return blob.get_plain(part.blob_key, part.checksum) is not None
    return blob.get(part.blob_key) is not None


def _types(client: persist.Client) -> tuple[pa.Schema, object, object]:
    t = Types.of(client.state.collections["c"])
    return t.schema, t.key, t.value
