"""The local store never follows a symbolic link, and no OSError escapes it.

Every port method is driven against hostile layouts planted in the root (links to files and
folders inside and outside the root, dangling and looping links, a file where a folder is
expected and the reverse, a FIFO, names too long, a linked ``.cf/``), then by hypothesis over
random layouts and calls. Each call must end with a value or an error of the tree, and the
folder outside the root must be byte-for-byte and link-for-link what it was.

Every test here runs twice: with ``openat2`` resolving whole paths (the fast path) and with it
taken away, as on a kernel without it (the walk, one folder at a time).
"""

from __future__ import annotations

import errno
import hashlib
import os
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import shared.storage._local as local_mod
import shared.storage._local_fs as fs_mod
import shared.storage._local_scan as scan_mod
import shared.storage._local_tree as tree_mod
from shared._errors import (
    BadInput,
    CommitfleetError,
    ConfigError,
    LinkRefused,
    NotFound,
    TransientError,
)
from shared.storage._local import LocalStore
from shared.storage._local_fs import os_error


@pytest.fixture(autouse=True, params=["openat2", "walk"])
def resolver(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Run the test with ``openat2`` (as this kernel has it) and without it (the walk)."""
    if request.param == "walk":
        monkeypatch.setattr(tree_mod, "openat2", None)
    return str(request.param)


SECRET = b"outside the root: never published"


def _snapshot(top: Path) -> dict[str, tuple[str, bytes]]:
    """Every entry under ``top`` (links not followed): kind and bytes / link target."""
    out: dict[str, tuple[str, bytes]] = {}
    for dirpath, dirnames, filenames in os.walk(top, followlinks=False):
        for name in [*dirnames, *filenames]:
            path = Path(dirpath) / name
            rel = str(path.relative_to(top))
            if path.is_symlink():
                out[rel] = ("link", os.readlink(path).encode())
            elif path.is_dir():
                out[rel] = ("dir", b"")
            elif path.is_file():
                out[rel] = ("file", path.read_bytes())
            else:
                out[rel] = ("other", b"")
    return out


def _outside(tmp_path: Path) -> Path:
    out = tmp_path / "outside"
    (out / "dir").mkdir(parents=True)
    (out / "secret").write_bytes(SECRET)
    (out / "dir" / "x").write_bytes(SECRET)
    return out


def _plant(root: Path, outside: Path) -> None:
    (root / "real").mkdir()
    (root / "real" / "a").write_bytes(b"inside")
    (root / "lnfile").symlink_to(outside / "secret")
    (root / "lndir").symlink_to(outside / "dir")
    (root / "dangling").symlink_to(outside / "nothere")
    (root / "inlink").symlink_to(root / "real" / "a")
    (root / "indir").symlink_to(root / "real")
    (root / "loop").symlink_to(root / "loop")
    (root / "afile").write_bytes(b"a file")
    (root / "adir").mkdir()
    (root / "adir" / "keep").write_bytes(b"keep")
    os.mkfifo(root / "fifo")


LONG = "n" * 300
OPS = [
    "read",
    "head",
    "head_md5",
    "write",
    "write_if_absent",
    "write_if_match",
    "delete",
    "copy_from",
    "copy_to",
]

# key -> the error every op must raise (None: the op returns), with per-op exceptions.
_LINK = {op: LinkRefused for op in OPS}
EXPECTED: dict[str, dict[str, type[CommitfleetError] | None]] = {
    "lnfile": _LINK,
    "lndir/x": _LINK,
    "dangling": _LINK,
    "inlink": _LINK,
    "indir/a": _LINK,
    "loop": _LINK,
    "lndir/new/deeper": _LINK,
    "afile/x": {
        **{op: NotFound for op in ("read", "head", "head_md5", "copy_from")},
        **{op: BadInput for op in ("write", "write_if_absent", "write_if_match", "copy_to")},
        "delete": None,
    },
    "adir": {
        **{op: NotFound for op in ("read", "head", "head_md5", "copy_from")},
        **{op: BadInput for op in ("write", "write_if_absent", "write_if_match", "copy_to")},
        "delete": None,
    },
    "fifo": {op: BadInput for op in OPS},
    LONG: {op: BadInput for op in OPS},
    f"{LONG}/x": {op: BadInput for op in OPS},
}


def _call(store: LocalStore, op: str, key: str) -> Callable[[], Awaitable[object]]:
    calls: dict[str, Callable[[], Awaitable[object]]] = {
        "read": lambda: store.read(key),
        "head": lambda: store.head(key),
        "head_md5": lambda: store.head_md5(key),
        "write": lambda: store.write(key, b"new"),
        "write_if_absent": lambda: store.write_if_absent(key, b"new"),
        "write_if_match": lambda: store.write_if_match(key, b"new", "1-1"),
        "delete": lambda: store.delete(key),
        "copy_from": lambda: store.copy(key, "fresh/copy"),
        "copy_to": lambda: store.copy("real/a", key),
    }
    return calls[op]


@pytest.mark.parametrize("key", sorted(EXPECTED))
async def test_every_method_refuses_each_hostile_layout_and_touches_nothing_outside(
    tmp_path: Path, key: str
) -> None:
    outside = _outside(tmp_path)
    root = tmp_path / "root"
    store = LocalStore(root, durable=False)
    _plant(root, outside)
    before_out, before_root = _snapshot(outside), _snapshot(root)
    for op in OPS:
        want = EXPECTED[key][op]
        if want is None:
            await _call(store, op, key)()
        else:
            with pytest.raises(want) as info:
                await _call(store, op, key)()
            if want is not LinkRefused:
                assert not isinstance(info.value, LinkRefused), (op, info.value)
        assert _snapshot(outside) == before_out, op
        after = _snapshot(root)
        after.pop(".cf/stripes", None)
        assert {k: v for k, v in after.items() if not k.startswith(".cf")} == {
            k: v for k, v in before_root.items() if not k.startswith(".cf")
        }, op
    assert os.listdir(root / ".cf" / "tmp") == []  # refused writes leave no temp file


async def test_listing_never_yields_links_nor_descends_into_linked_folders(tmp_path: Path) -> None:
    outside = _outside(tmp_path)
    root = tmp_path / "root"
    store = LocalStore(root, durable=False)
    _plant(root, outside)
    (root / "real" / "sub").symlink_to(outside / "dir")
    listed = [i.key async for i in store.list()]
    assert listed == ["adir/keep", "afile", "real/a"]
    for prefix in ("lndir/", "lndir/x", "indir/", "lnfile", "real/sub/", "afile/", "loop/", "dangling"):
        assert [i.key async for i in store.list(prefix)] == [], prefix
    assert [i.key async for i in store.list("real/")] == ["real/a"]


async def test_good_keys_still_work_next_to_hostile_ones(tmp_path: Path) -> None:
    root = tmp_path / "root"
    store = LocalStore(root, durable=False)
    _plant(root, _outside(tmp_path))
    info = await store.write("real/b/c", b"hello")
    assert (await store.read("real/b/c")).data == b"hello"
    md5 = await store.head_md5("real/b/c")
    assert md5.checksum == hashlib.md5(b"hello").hexdigest()
    assert (md5.size, md5.version) == (5, info.version)
    assert (await store.copy("real/b/c", "real/d")).size == 5
    await store.delete("real/b/c")
    assert not (root / "real" / "b").exists()  # empty folder pruned, "real" kept (not empty)
    assert (root / "real").is_dir()


async def test_a_linked_reserved_area_refuses_writes_and_keeps_temp_files_inside(tmp_path: Path) -> None:
    outside = _outside(tmp_path)
    root = tmp_path / "root"
    store = LocalStore(root, durable=False)
    os.rmdir(root / ".cf" / "tmp")
    (root / ".cf" / "tmp").symlink_to(outside / "dir")
    before = _snapshot(outside)
    with pytest.raises(LinkRefused):
        await store.write("k", b"x")
    assert _snapshot(outside) == before
    with pytest.raises(ConfigError):
        LocalStore(root, durable=False)  # a new store refuses such a root at once


async def test_a_folder_swapped_for_a_link_after_the_first_write_is_refused(tmp_path: Path) -> None:
    # The attack of the issue: staging written, then a folder replaced by a link to elsewhere.
    outside = _outside(tmp_path)
    root = tmp_path / "root"
    store = LocalStore(root, durable=False)
    await store.write("_staging/j/ds/0-0/part", b"mine")
    os.rename(root / "_staging" / "j" / "ds" / "0-0", tmp_path / "moved")
    (root / "_staging" / "j" / "ds" / "0-0").symlink_to(outside / "dir")
    before = _snapshot(outside)
    with pytest.raises(LinkRefused):
        await store.copy("_staging/j/ds/0-0/x", "ds/published")
    with pytest.raises(LinkRefused):
        await store.delete("_staging/j/ds/0-0/x")
    assert [i.key async for i in store.list("_staging/")] == []
    assert _snapshot(outside) == before
    with pytest.raises(NotFound):
        await store.head("ds/published")


@pytest.mark.parametrize("code", sorted(errno.errorcode))
def test_every_errno_maps_into_the_tree(code: int) -> None:
    err = os_error(OSError(code, os.strerror(code)), "op")
    assert isinstance(err, CommitfleetError)
    if code == errno.ENOENT:
        assert isinstance(err, NotFound)
    elif code == errno.ELOOP:
        assert isinstance(err, LinkRefused)
    elif code in (errno.EACCES, errno.EPERM, errno.EROFS):
        assert isinstance(err, ConfigError)
    elif code in (errno.ENOSPC, errno.EIO, errno.EMFILE):
        assert isinstance(err, TransientError)
    elif code in (errno.ENAMETOOLONG, errno.ENOTDIR, errno.EISDIR):
        assert isinstance(err, BadInput)


# -- fuzz: random layouts, random calls ---------------------------------------------------------

_NAMES = st.sampled_from(["a", "b", "c"])
_KEYS = st.lists(_NAMES, min_size=1, max_size=4).map("/".join)
_NODE = st.sampled_from(["file", "dir", "link_out_file", "link_out_dir", "link_in", "dangling", "fifo"])


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    layout=st.lists(st.tuples(_KEYS, _NODE), max_size=8),
    calls=st.lists(st.tuples(st.sampled_from([*OPS, "list"]), _KEYS), min_size=1, max_size=8),
)
async def test_fuzz_hostile_layouts_only_tree_errors_and_outside_untouched(
    tmp_path_factory: pytest.TempPathFactory,
    layout: list[tuple[str, str]],
    calls: list[tuple[str, str]],
) -> None:
    base = tmp_path_factory.mktemp("fuzz")
    outside = _outside(base)
    root = base / "root"
    store = LocalStore(root, durable=False)
    (root / "real").mkdir()
    (root / "real" / "a").write_bytes(b"inside")
    for key, kind in layout:
        path = root / key
        if os.path.lexists(path):
            # Planted twice: keep the first (opening a planted FIFO to write would block for ever).
            continue
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            if kind == "file":
                path.write_bytes(b"file " + key.encode())
            elif kind == "dir":
                path.mkdir()
            elif kind == "fifo":
                os.mkfifo(path)
            else:
                target = {
                    "link_out_file": outside / "secret",
                    "link_out_dir": outside / "dir",
                    "link_in": root / "real",
                    "dangling": outside / "gone",
                }[kind]
                path.symlink_to(target)
        except OSError:
            continue  # the planted layout conflicts with itself: keep what was made
    before = _snapshot(outside)
    for op, key in calls:
        try:
            if op == "list":
                got = [i async for i in store.list(key)]
                for info in got:
                    assert not (root / info.key).is_symlink()
                    assert (await store.read(info.key)).data != SECRET
                continue
            result = await _call(store, op, key)()
        except CommitfleetError:
            continue
        if op == "read":
            assert getattr(result, "data", None) != SECRET
    assert _snapshot(outside) == before


# -- every OS error at every OS call of every method ---------------------------------------------

_FAULTABLE = frozenset(
    {
        "open",
        "stat",
        "rename",
        "unlink",
        "mkdir",
        "rmdir",
        "fstat",
        "fsync",
        "utime",
        "scandir",
        "read",
        "write",
    }
)
_INJECTED = [
    errno.EACCES,
    errno.EPERM,
    errno.EROFS,
    errno.EIO,
    errno.ENOSPC,
    errno.EMFILE,
    errno.ENAMETOOLONG,
    errno.ELOOP,
    errno.ENOTDIR,
    errno.EISDIR,
    errno.ENOENT,
    errno.EEXIST,
]


class _FaultyOs:
    """Stands for the ``os`` module inside the local store: the k-th file-system call fails with ``code``."""

    def __init__(self, fail_at: int | None = None, code: int = errno.EIO) -> None:
        self.calls = 0
        self.fail_at = fail_at
        self.code = code

    def __getattr__(self, name: str) -> object:
        real = getattr(os, name)
        if name not in _FAULTABLE:
            return real

        def call(*args: object, **kwargs: object) -> object:
            self.calls += 1
            if self.calls == self.fail_at:
                raise OSError(self.code, os.strerror(self.code))
            return real(*args, **kwargs)

        return call

    def wrap(self, real: tree_mod.OpenAt2 | None) -> tree_mod.OpenAt2 | None:
        """Return ``real`` (``openat2``) counted and failing like the ``os`` calls."""
        if real is None:
            return None

        def call(dir_fd: int, path: str, flags: int, mode: int) -> int:
            self.calls += 1
            if self.calls == self.fail_at:
                raise OSError(self.code, os.strerror(self.code))
            return real(dir_fd, path, flags, mode)

        return call

    def install(self, monkeypatch: pytest.MonkeyPatch, openat2: tree_mod.OpenAt2 | None) -> None:
        for mod in (local_mod, fs_mod, tree_mod, scan_mod):
            monkeypatch.setattr(mod, "os", self)
        monkeypatch.setattr(tree_mod, "openat2", self.wrap(openat2))


def _uninstall(monkeypatch: pytest.MonkeyPatch, openat2: tree_mod.OpenAt2 | None) -> None:
    for mod in (local_mod, fs_mod, tree_mod, scan_mod):
        monkeypatch.setattr(mod, "os", os)
    monkeypatch.setattr(tree_mod, "openat2", openat2)


async def _prepared(root: Path) -> tuple[LocalStore, str]:
    info = await LocalStore(root, durable=False).write("a/b/obj", b"object bytes")
    return LocalStore(root, durable=True), info.version  # durable: its fsyncs get faults too


_METHOD_OPS = [*OPS, "list"]


@pytest.mark.parametrize("op", _METHOD_OPS)
async def test_every_os_error_at_every_call_comes_out_as_a_tree_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, op: str
) -> None:
    openat2 = tree_mod.openat2  # None when the walk is tested

    async def run(store: LocalStore, version: str) -> None:
        # Each call is one that succeeds without faults, so every OS call on its path is reached.
        if op == "list":
            [i async for i in store.list("a/")]
        elif op == "copy_to":
            await store.copy("a/b/obj", "a/c/new")
        elif op == "write_if_absent":
            await store.write_if_absent("a/d/new", b"new")
        elif op == "write_if_match":
            await store.write_if_match("a/b/obj", b"new", version)
        elif op == "copy_from":
            await store.copy("a/b/obj", "fresh/copy")
        else:
            await _call(store, op, "a/b/obj")()

    counting = _FaultyOs()
    store, version = await _prepared(tmp_path / "count")
    counting.install(monkeypatch, openat2)
    await run(store, version)
    total = counting.calls
    assert total >= 2, op
    seen: set[type[BaseException]] = set()
    for code in _INJECTED:
        for k in range(1, total + 1):
            _uninstall(monkeypatch, openat2)
            store, version = await _prepared(tmp_path / f"{op}-{code}-{k}")
            _FaultyOs(fail_at=k, code=code).install(monkeypatch, openat2)
            try:
                await run(store, version)
            except CommitfleetError as exc:
                seen.add(type(exc))
            # Anything else (a raw OSError) fails the test here, with its errno and call number.
    assert seen, op  # the faults did reach the method


async def test_the_configured_root_itself_may_lie_behind_a_link(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "via").symlink_to(tmp_path / "real")
    store = LocalStore(tmp_path / "via" / "store", durable=False)
    await store.write("a/b", b"x")
    assert (tmp_path / "real" / "store" / "a" / "b").read_bytes() == b"x"
    assert [i.key async for i in store.list()] == ["a/b"]
