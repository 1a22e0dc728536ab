"""Crash-safe files for the state dir and reports/: the one place gpuforge reads and writes them.

- A write goes to a unique temp file in the same folder, is fsynced, renamed over the target and the
  folder fsynced: a reader sees the old file or the new one, never a torn or empty one, and a crash or a
  full disk leaves the old one whole (the temp file is removed).
- Writers hold an exclusive `fcntl.flock` on the folder's lock file, readers a shared one, so a
  read-modify-write (`update`) of one process never loses another's field. flock is per open file, so
  it serialises threads and processes alike.
- Nothing below the root the user named (--reports DIR, GPUFORGE_STATE_DIR) is followed if it is a
  symlink: folders are opened one component at a time with O_NOFOLLOW, files with O_NOFOLLOW, and a
  rename replaces a link rather than writing through it. The root itself may be a link (the user chose it).
- Every OSError (ENOSPC, EACCES, EROFS, EISDIR, ELOOP ...) becomes one StateError line naming the path.
- A folder of generated files (images/dist/<id>/) is replaced as one (`replace_folder`): written beside it, then
  swapped in, so a crash leaves the old folder or the new one, never a half-written one.
- Outputs (files written where a flag says: `--output`, the base lock) use the same writer through
  `write_output(s)`, except that a symlink at a file name is refused rather than replaced: the user named
  a file, and silently swapping their link for one is as surprising as writing through it.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import os
import secrets
import shutil
import stat
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import TextIO

from gpuforge.errors import StateError

LOCK_NAME = ".gpuforge.lock"
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
_WHY = {
    errno.ENOSPC: "no space left on device: free some and re-run",
    errno.EDQUOT: "disk quota exceeded: free some and re-run",
    errno.EACCES: "permission denied: fix its permissions or choose another folder",
    errno.EPERM: "operation not permitted: fix its permissions or choose another folder",
    errno.EROFS: "read-only file system: choose a writable folder",
    errno.EISDIR: "is a directory, not a file: remove or rename it",
    errno.ENOTDIR: "a path component is not a folder: remove or rename it",
    errno.ELOOP: "is a symlink, which gpuforge does not follow here: replace it with a real file or folder",
    errno.ENOENT: "does not exist",
}


def error(path: Path | str, e: OSError) -> StateError:
    """An OSError as the one line a user sees: the path, then what is wrong and what to do."""
    why = _WHY.get(e.errno or 0, e.strerror or str(e))
    err = StateError(f"{path}: {why}")
    err.errno = e.errno
    return err


def _open_dir(root: Path, parts: tuple[str, ...], *, create: bool) -> int:
    """A file descriptor of root/parts..., each part opened without following a symlink (created when asked)."""
    try:
        if create:
            root.mkdir(parents=True, exist_ok=True)
        fd = os.open(root, _DIR_FLAGS)
    except OSError as e:
        raise error(root, e) from None
    path = root
    try:
        for part in parts:
            path = path / part
            if create:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(part, 0o755, dir_fd=fd)
            try:
                nfd = os.open(part, _DIR_FLAGS | os.O_NOFOLLOW, dir_fd=fd)
            except OSError as e:
                if e.errno == errno.ENOTDIR and os.path.islink(path):
                    e = OSError(errno.ELOOP, "symlink")
                raise error(path, e) from None
            os.close(fd)
            fd = nfd
    except BaseException:
        os.close(fd)
        raise
    return fd


class Folder:
    """A folder under a root, opened without following symlinks below the root; use as a context manager."""

    def __init__(self, root: Path | str, *parts: str, create: bool = True):
        self.root, self.parts = Path(root), tuple(p for p in parts if p)
        self.path = self.root.joinpath(*self.parts)
        self.fd = _open_dir(self.root, self.parts, create=create)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> Folder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextlib.contextmanager
    def locked(self, *, shared: bool = False) -> Iterator[Folder]:
        """Hold the folder's lock: exclusive for writers, shared for readers."""
        lock = self.path / LOCK_NAME
        flags = os.O_NOFOLLOW | os.O_CLOEXEC
        try:
            try:
                lfd = os.open(LOCK_NAME, flags | (os.O_RDONLY if shared else os.O_RDWR), dir_fd=self.fd)
            except FileNotFoundError:
                lfd = os.open(LOCK_NAME, flags | os.O_RDWR | os.O_CREAT, 0o644, dir_fd=self.fd)
        except OSError as e:
            if shared and e.errno in (errno.EROFS, errno.EACCES):  # no one can write here: read unlocked
                yield self
                return
            raise error(lock, e) from None
        try:
            fcntl.flock(lfd, fcntl.LOCK_SH if shared else fcntl.LOCK_EX)
            yield self
        finally:
            os.close(lfd)  # closing drops the lock

    def read_bytes(self, name: str) -> bytes | None:
        """The file's bytes, None when it does not exist; a symlink or a folder is refused."""
        try:
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=self.fd)
        except FileNotFoundError:
            return None
        except OSError as e:
            raise error(self.path / name, e) from None
        try:
            if not _is_regular(fd):
                raise error(self.path / name, OSError(errno.EISDIR, "not a regular file"))
            chunks = []
            while chunk := os.read(fd, 1 << 20):
                chunks.append(chunk)
            return b"".join(chunks)
        except OSError as e:
            raise error(self.path / name, e) from None
        finally:
            os.close(fd)

    def write_bytes(self, name: str, data: bytes, *, mode: int = 0o644) -> Path:
        """Replace the file atomically: unique temp file, fsync, rename, fsync the folder."""
        self.write_set({name: data}, mode=mode)
        return self.path / name

    def write_set(self, contents: dict[str, bytes], *, mode: int = 0o644, refuse_links: bool = False) -> None:
        """Replace several files as one: every temp file is written and fsynced before the first rename, so
        a full disk or a permission error leaves every previous file as it was (and no temp file behind).
        With refuse_links, a symlink at any of the names fails the whole set before anything is written."""
        if refuse_links:
            self._refuse_links(contents)
        temps: dict[str, str] = {}
        try:
            for name, data in contents.items():
                if "/" in name or name in ("", ".", ".."):
                    msg = f"not a file name: {name!r}"
                    raise ValueError(msg)
                tmp = temps[name] = f".{name}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
                try:
                    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode,
                                 dir_fd=self.fd)
                except OSError as e:
                    del temps[name]
                    raise error(self.path / name, e) from None
                try:
                    view = memoryview(data)
                    while view:
                        view = view[os.write(fd, view):]
                    os.fsync(fd)
                except OSError as e:
                    raise error(self.path / name, e) from None
                finally:
                    os.close(fd)
            for name, tmp in list(temps.items()):
                try:  # rename replaces a symlink at `name`, never writes through it
                    os.rename(tmp, name, src_dir_fd=self.fd, dst_dir_fd=self.fd)
                except OSError as e:
                    raise error(self.path / name, e) from None
                del temps[name]
        finally:  # an error or Ctrl-C before the renames: no temp file left behind
            for tmp in temps.values():
                with contextlib.suppress(OSError):
                    os.unlink(tmp, dir_fd=self.fd)
        try:
            os.fsync(self.fd)
        except OSError as e:
            raise error(self.path, e) from None

    def write_text(self, name: str, text: str) -> Path:
        return self.write_bytes(name, text.encode())

    def _refuse_links(self, names: Iterable[str]) -> None:
        # A link swapped in after this check is only replaced by the rename, never written through.
        for name in names:
            try:
                st = os.stat(name, dir_fd=self.fd, follow_symlinks=False)
            except FileNotFoundError:
                continue
            except OSError as e:
                raise error(self.path / name, e) from None
            if stat.S_ISLNK(st.st_mode):
                raise error(self.path / name, OSError(errno.ELOOP, "symlink"))


_RENAME_EXCHANGE = 2  # renameat2's flag (linux/fs.h): swap two names in one step


def _exchange(dir_fd: int, a: str, b: str) -> bool:
    """Swap two entries of one folder in one step (Linux renameat2 RENAME_EXCHANGE); False where the C library or
    the file system cannot, so the caller falls back to two renames."""
    try:
        renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):
        return False
    if renameat2(dir_fd, os.fsencode(a), dir_fd, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
        return False
    raise OSError(err, os.strerror(err))


def replace_folder(path: Path | str, contents: dict[str, bytes], *, mode: int = 0o644) -> Path:
    """Replace a folder of generated files as one. The files are written and fsynced into a new sibling
    (`.<name>.<pid>.<random>.tmp`), which then takes the folder's place: exchanged with the old folder in one step
    where the kernel can (then the old one is removed), else after the old one is renamed aside. A crash, Ctrl-C
    or a full disk before the swap leaves the old folder whole and no sibling; a reader never sees some files new
    and others old, or a folder half written. (Only with the fallback, a crash between its two renames leaves the
    folder absent and both versions beside it as dot-folders.)"""
    p = Path(path)
    name, tag = p.name, f"{os.getpid()}.{secrets.token_hex(4)}"
    new, old = f".{name}.{tag}.tmp", f".{name}.{tag}.old"
    with Folder(p.parent) as parent:
        try:
            try:
                os.mkdir(new, 0o777, dir_fd=parent.fd)  # the umask decides, as for any new folder
            except OSError as e:
                raise error(p.parent / new, e) from None
            with Folder(parent.path, new, create=False) as d:
                d.write_set(contents, mode=mode)
            at = {"src_dir_fd": parent.fd, "dst_dir_fd": parent.fd}
            try:
                try:
                    os.stat(name, dir_fd=parent.fd, follow_symlinks=False)
                except FileNotFoundError:
                    os.rename(new, name, **at)  # nothing to replace
                else:
                    if not _exchange(parent.fd, new, name):  # after an exchange, `new` names the old folder
                        os.rename(name, old, **at)
                        try:
                            os.rename(new, name, **at)
                        except BaseException:
                            os.rename(old, name, **at)  # the old folder back in its place
                            raise
            except OSError as e:
                raise error(p, e) from None
        finally:  # the unfinished new folder after an error, the replaced one (or a link that stood there) after the swap
            for left in (new, old):
                with contextlib.suppress(OSError):
                    if stat.S_ISDIR(os.stat(left, dir_fd=parent.fd, follow_symlinks=False).st_mode):
                        shutil.rmtree(left, dir_fd=parent.fd)
                    else:
                        os.unlink(left, dir_fd=parent.fd)
        try:
            os.fsync(parent.fd)
        except OSError as e:
            raise error(p.parent, e) from None
    return p


def _is_regular(fd: int) -> bool:
    return stat.S_ISREG(os.fstat(fd).st_mode)


def split(path: Path | str, root: Path | str | None = None) -> tuple[Path, tuple[str, ...], str]:
    """(root, folder parts below it, file name) for a file path; without `root`, the file's own folder is
    the root (only the file itself is then protected from symlinks)."""
    p = Path(path)
    if root is None:
        return p.parent, (), p.name
    r = Path(root)
    try:
        rel = p.relative_to(r)
    except ValueError:
        return p.parent, (), p.name
    return r, rel.parts[:-1], rel.name


def write_text(path: Path | str, text: str, *, root: Path | str | None = None) -> Path:
    """Write one file atomically under its folder's exclusive lock."""
    r, parts, name = split(path, root)
    with Folder(r, *parts) as d, d.locked():
        return d.write_text(name, text)


def read_text(path: Path | str, *, root: Path | str | None = None) -> str | None:
    """Read one file (None when absent) under its folder's shared lock, refusing symlinks and bad UTF-8."""
    r, parts, name = split(path, root)
    try:
        d = Folder(r, *parts, create=False)
    except StateError as e:
        if e.errno == errno.ENOENT:  # no folder, so no file
            return None
        raise
    with d, d.locked(shared=True):
        data = d.read_bytes(name)
    if data is None:
        return None
    try:
        return data.decode()
    except UnicodeDecodeError:
        msg = f"{path}: not UTF-8 text (random bytes?); delete it and re-run the step that writes it"
        raise StateError(msg) from None


def open_log(path: Path | str) -> TextIO:
    """A live log (line-buffered text, truncated), created with its folder: not atomic, since it is tailed
    while it grows, but a symlink at it is refused like any file here, and a refusal is one StateError."""
    p = Path(path)
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    except OSError as e:
        raise error(p, e) from None
    return os.fdopen(fd, "w", buffering=1)


def write_output(path: Path | str, data: str | bytes) -> Path:
    """One file the user named (--output FILE), atomically; its folder is created and may be a link (the
    user chose it); a symlink at the file is refused."""
    p = Path(path)
    write_outputs(p.parent, {p.name: data})
    return p


def write_outputs(root: Path | str, contents: Mapping[str, str | bytes], *, below: tuple[str, ...] = ()) -> Path:
    """Several files into root/below..., all or nothing (Folder.write_set); nothing below `root` is followed
    if it is a link, a symlink at a file name is refused. No lock file: nothing read-modify-writes an
    output and a rename is atomic on its own, while a lock file would litter the user's folder."""
    data = {n: v.encode() if isinstance(v, str) else v for n, v in contents.items()}
    with Folder(root, *below) as d:
        d.write_set(data, refuse_links=True)
        return d.path
