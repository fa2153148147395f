"""The local store's resolution of keys: ``openat2`` from the held root, and the walk it falls back to.

Both paths run every test here (``resolver``): the fast path as this kernel has it, and the walk
with ``openat2`` taken away, or answering ``ENOSYS``/``EPERM`` as an old kernel or a seccomp
filter does. Links are planted at every depth of a key; the fsyncs a durable write makes are
checked one by one; the root's descriptor is held for the store's life and let go by close().
"""

from __future__ import annotations

import asyncio
import errno
import os
import platform
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

import shared.storage._local_fs as fs_mod
import shared.storage._local_tree as tree_mod
from shared._errors import LinkRefused, NotFound
from shared.storage._local import LocalStore
from tests._support.fsyncs import record_fsyncs

_REAL_OPENAT2 = tree_mod.openat2
SECRET = b"outside the root"
DEPTH = 5  # d0/d1/d2/d3/obj


@pytest.fixture(autouse=True, params=["openat2", "walk", "ENOSYS", "EPERM"])
def resolver(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """The fast path; no openat2 at all; openat2 answering as an old kernel or a seccomp filter."""
    mode = str(request.param)
    if mode == "walk":
        monkeypatch.setattr(tree_mod, "openat2", None)
    elif mode in ("ENOSYS", "EPERM"):
        code = getattr(errno, mode)

        def refuse(dir_fd: int, path: str, flags: int, mode: int) -> int:
            raise OSError(code, os.strerror(code), path)

        monkeypatch.setattr(tree_mod, "openat2", refuse)
    return mode


def _key(depth: int = DEPTH) -> str:
    return "/".join([*(f"d{i}" for i in range(depth - 1)), "obj"])


async def test_the_fast_path_is_taken_where_the_kernel_has_openat2(tmp_path: Path, resolver: str) -> None:
    store = LocalStore(tmp_path / "root", durable=False)
    await store.write("a", b"x")
    linux_56 = sys.platform.startswith("linux") and tuple(map(int, platform.release().split(".")[:2])) >= (
        5,
        6,
    )
    expected = resolver == "openat2" and linux_56 and platform.machine() in tree_mod._SAME_NUMBER
    assert store._tree.fast is expected


async def test_a_deep_key_takes_one_call_on_the_fast_path_and_a_walk_otherwise(
    tmp_path: Path, resolver: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = LocalStore(tmp_path / "root", durable=False)
    await store.write(_key(), b"deep")
    fast: list[str] = []
    walked: list[str] = []
    real_openat2, real_open_dir = tree_mod.openat2, fs_mod.open_dir

    def counted(dir_fd: int, path: str, flags: int, mode: int) -> int:
        fast.append(path)
        assert real_openat2 is not None
        return real_openat2(dir_fd, path, flags, mode)

    def open_dir(parent: int, name: str, **kwargs: bool | str) -> int:
        walked.append(name)
        return real_open_dir(parent, name, **kwargs)  # type: ignore[arg-type]

    if real_openat2 is not None:
        monkeypatch.setattr(tree_mod, "openat2", counted)
    monkeypatch.setattr(fs_mod, "open_dir", open_dir)
    for call in (store.read, store.head):
        await call(_key())
        if resolver == "openat2":
            assert (fast, walked) == ([_key()], []), call
        else:
            assert (fast, walked) == ([], _key().split("/")[:-1]), call
        fast.clear()
        walked.clear()


def _outside_copy(tmp_path: Path, depth: int) -> Path:
    """A folder outside the root holding the rest of the key below ``depth``, so following a link works."""
    out = tmp_path / "outside" / f"at{depth}"
    rest = _key().split("/")[depth + 1 :]
    target = out.joinpath(*rest) if rest else out / "obj"
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(SECRET)
    return out if rest else target


def _snapshot(top: Path) -> dict[str, bytes]:
    out: dict[str, bytes] = {}
    for dirpath, dirnames, filenames in os.walk(top):
        for name in [*dirnames, *filenames]:
            path = Path(dirpath) / name
            out[str(path.relative_to(top))] = path.read_bytes() if path.is_file() else b"dir"
    return out


@pytest.mark.parametrize("depth", range(DEPTH))
async def test_a_link_at_every_depth_is_refused_by_every_method(tmp_path: Path, depth: int) -> None:
    root = tmp_path / "root"
    store = LocalStore(root, durable=False)
    key = _key()
    await store.write(key, b"inside")
    parts = key.split("/")
    planted = root.joinpath(*parts[: depth + 1])
    prefix = "/".join(parts[: depth + 1])
    target = _outside_copy(tmp_path, depth)
    planted.rename(tmp_path / "moved")  # the real folder (or object) out of the way
    planted.symlink_to(target)
    before = _snapshot(tmp_path / "outside")
    calls: dict[str, Callable[[], Awaitable[object]]] = {
        "read": lambda: store.read(key),
        "head": lambda: store.head(key),
        "head_md5": lambda: store.head_md5(key),
        "write": lambda: store.write(key, b"new"),
        "write_if_absent": lambda: store.write_if_absent(key, b"new"),
        "write_if_match": lambda: store.write_if_match(key, b"new", "1-1"),
        "write_below": lambda: store.write(f"{prefix}/new", b"new"),
        "delete": lambda: store.delete(key),
        "copy_from": lambda: store.copy(key, "fresh/copy"),
        "copy_to": lambda: store.copy("fresh/src", key),
    }
    await store.write("fresh/src", b"src")
    for op, call in calls.items():
        with pytest.raises(LinkRefused):
            await call()
        assert planted.is_symlink(), op
        assert _snapshot(tmp_path / "outside") == before, op
    assert [i.key async for i in store.list(prefix + "/")] == []
    assert [i.key async for i in store.list(prefix)] == []
    assert [i.key async for i in store.list()] == ["fresh/src"]
    assert os.listdir(root / ".cf" / "tmp") == []


async def test_a_durable_write_fsyncs_the_file_its_folder_and_the_parent_of_each_folder_it_made(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "root"
    store = LocalStore(root, durable=True)
    await store.write("keep", b"warm")  # the root is opened (and openat2 probed) before counting
    synced = record_fsyncs(monkeypatch)
    info = await store.write("n1/n2/k", b"data")
    ino = {p: (root / p).stat().st_ino for p in ("", "n1", "n1/n2", "n1/n2/k")}
    assert int(info.version.split("-")[0], 16) == ino["n1/n2/k"]
    # file before rename, root for n1, n1 for n2, n2 after the rename; nothing else (not .cf/tmp).
    assert sorted(synced) == sorted(ino.values()), (synced, ino)
    synced.clear()
    await store.write("n1/n2/k", b"again")  # folders exist: the file and its folder only
    assert sorted(synced) == sorted([(root / "n1/n2/k").stat().st_ino, ino["n1/n2"]])
    synced.clear()
    await store.delete("n1/n2/k")
    assert synced == []  # deletes are atomic, not fsynced (see the module doc)


def _fds_on(folder: Path) -> int:
    """How many of this process's descriptors are open on ``folder`` (other tests' fds come and go)."""
    target = str(folder.resolve())
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            count += os.readlink(f"/proc/self/fd/{fd}") == target
        except OSError:
            continue  # closed meanwhile (the listing's own descriptor, a finalised socket)
    return count


async def test_the_root_is_held_while_used_and_let_go_by_close(tmp_path: Path) -> None:
    root = tmp_path / "root"
    store = LocalStore(root, durable=False)
    assert _fds_on(root) == 0  # a store never used holds nothing
    await store.write("a/b", b"x")
    assert _fds_on(root) == 1  # the root, held
    await store.close()
    assert _fds_on(root) == 0
    assert (await store.read("a/b")).data == b"x"  # usable again: opened again
    assert _fds_on(root) == 1
    await store.close()
    await store.close()  # twice is fine
    assert _fds_on(root) == 0


async def test_close_during_operations_waits_for_the_last_one(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "root", durable=False)
    await store.write("k", b"x")
    tree = store._tree
    with tree.held() as fd:  # an operation under way
        tree.close()
        os.fstat(fd)  # still open: not closed under the running operation
        assert tree._fd == fd
    assert tree._fd == -1  # closed by the last one out


async def test_concurrent_listings_of_the_root_each_see_everything(tmp_path: Path) -> None:
    # The root's descriptor is shared by every thread, and a folder's read position with it:
    # listings that read it directly would split the entries between them.
    store = LocalStore(tmp_path / "root", durable=False)
    names = [f"k{i:04d}" for i in range(400)]
    for name in names:
        (tmp_path / "root" / name).write_bytes(b"x")
    for _ in range(3):
        results = await asyncio.gather(*(_keys(store) for _ in range(16)))
        assert all(r == names for r in results)


async def _keys(store: LocalStore) -> list[str]:
    return [i.key async for i in store.list()]


async def test_a_reader_of_a_missing_key_is_told_not_found_on_both_paths(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "root", durable=False)
    await store.write("a/b/c", b"x")
    for key in ("a/b/zz", "a/zz/c", "zz/b/c", "a/b/c/d"):
        for call in (store.read, store.head, store.head_md5):
            with pytest.raises(NotFound):
                await call(key)
        await store.delete(key)  # nothing to delete: fine
    assert [i.key async for i in store.list()] == ["a/b/c"]
