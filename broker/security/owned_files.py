"""Files written into a directory that another user controls, without following their symlinks.

Why: the operator runs the CLI (`sepa-gateway clients ...`, `sepa-gateway sensors ...`) as root,
and it writes into the service's data directory, which the service user owns. That user can put
a symlink (or a hard link) where the CLI writes: an attack pass turned `clients.lock` and
`coap-sensors/NAME/.paths.json.new` into symlinks to root-only files, and root's `open(O_CREAT |
O_TRUNC)` and `os.chown` followed them (the root file was truncated, rewritten and given to the
service user). Here every name is opened relative to a descriptor of its directory opened with
O_NOFOLLOW, files are created with O_EXCL | O_NOFOLLOW under a fresh name and renamed into place
(rename replaces a symlink, it does not follow it), and ownership is changed on the open
descriptor (fchown), never by path.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import stat
from collections.abc import Iterator
from pathlib import Path

_DIRECTORY = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class UnsafeFileError(OSError):
    """A name the CLI would write is not a plain file of its own (a symlink, a hard link, a FIFO)."""


@contextlib.contextmanager
def open_directory(path: Path | str, at: int | None = None) -> Iterator[int]:
    """A descriptor of directory `path` (relative to directory descriptor `at` if given); refused
    (ELOOP, ENOTDIR) when `path` itself is a symlink."""
    descriptor = os.open(path, _DIRECTORY, dir_fd=at)
    try:
        yield descriptor
    finally:
        os.close(descriptor)


def directory_owner(descriptor: int) -> tuple[int, int] | None:
    """The (uid, gid) new files in this directory get when root writes them: the directory's own, so
    that the service can still use what a root CLI wrote; None when not root (chown is root's only)."""
    if os.geteuid() != 0:
        return None
    status = os.fstat(descriptor)
    return status.st_uid, status.st_gid


def make_directories(directory: Path) -> None:
    """Create `directory` and its missing parents (0700 whatever the umask), each owned like the one
    above it, so that a CLI run as root before the service's first start leaves nothing the service
    cannot use: `sensors add --coap` made `data/` root's (0777 under umask 000), the service then
    could not open its store and a later `clients add` made `security/` root's too (attack pass).
    One made meanwhile by another process is fine: the CLI and the service (or two CLI runs) may
    both find it missing, and the second failed with FileExistsError."""
    missing: list[Path] = []
    path = directory
    while not path.exists():
        missing.append(path)
        path = path.parent
    for path in reversed(missing):
        path.mkdir(mode=0o700, exist_ok=True)
        _same_owner_as(path, path.parent)


def _same_owner_as(path: Path, directory: Path) -> None:
    """Keep a directory just made owned by its parent's owner (the CLI may run as root beside the
    service user); not through a symlink that user may have put in its place since (lchown)."""
    if os.geteuid() != 0:
        return
    status = directory.stat()
    with contextlib.suppress(OSError):
        os.chown(path, status.st_uid, status.st_gid, follow_symlinks=False)


def give_root_entries(path: Path | str, owner: tuple[int, int]) -> int:
    """Give `owner` what root left under directory `path`; returns how many entries it gave.

    Why: `sepa-gateway sensors add --coap` run as root before the installer made the service's
    state directory left `data/` root's: the service could not open its store ("Permission
    denied"), and installing again did not help (attack pass). Root's entries become the owner's,
    less the group write and other bits the service's UMask=0027 never sets (umask 000 had made
    `data/` 0777). Walked by descriptors, never through a symlink (a link is given itself, lchown),
    and a file is changed on its open descriptor only if it is a plain file with one link: the
    service user, who owns the tree, must not get root to chown or chmod another file."""
    with open_directory(path) as descriptor:
        return _give_root_entries(descriptor, owner)


def _give_root_entries(directory: int, owner: tuple[int, int]) -> int:
    given = 0
    for name in os.listdir(directory):
        status = os.stat(name, dir_fd=directory, follow_symlinks=False)
        if stat.S_ISLNK(status.st_mode):
            if status.st_uid == 0:
                os.chown(name, *owner, dir_fd=directory, follow_symlinks=False)
                given += 1
        elif stat.S_ISDIR(status.st_mode):
            with open_directory(name, at=directory) as child:
                given += _take(child, owner) + _give_root_entries(child, owner)
        elif stat.S_ISREG(status.st_mode) and status.st_uid == 0:
            file = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=directory)
            try:
                given += _take(file, owner)
            finally:
                os.close(file)
    return given


def _take(descriptor: int, owner: tuple[int, int]) -> int:
    """Give open directory or plain file `descriptor` to `owner` if root owns it: 1 if given."""
    status = os.fstat(descriptor)
    plain = stat.S_ISDIR(status.st_mode) or (stat.S_ISREG(status.st_mode) and status.st_nlink == 1)
    if status.st_uid != 0 or not plain:
        return 0
    os.fchown(descriptor, *owner)
    os.fchmod(descriptor, stat.S_IMODE(status.st_mode) & ~0o027)
    return 1


def write_file(path: Path, data: bytes, mode: int = 0o600, owner: tuple[int, int] | None = None) -> None:
    """Replace `path` atomically with a new file holding `data`, `mode`, owned by `owner` (when root;
    by default the directory's owner). A reader never sees half a file, and a symlink or hard link
    at `path` or its temporary name is replaced or refused, never written through.

    Durable once it returns: the file synced, renamed, then the directory synced. Without the last
    (strace of `sepa-gateway clients add`: fsync of the temporary file, renameat, exit), the rename
    reached the disk only at the file system's next commit (ext4: up to 5 s), and a power cut
    before it brought back the previous clients.json: a registration already answered with its
    secret was unknown, a revocation or reset already confirmed undone (the revoked credentials
    worked again)."""
    with open_directory(path.parent) as directory:
        owner = owner or directory_owner(directory)
        temporary = f".{path.name}.{secrets.token_hex(6)}.tmp"
        descriptor = os.open(
            temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=directory
        )
        try:
            try:
                os.fchmod(descriptor, mode)  # the umask may have taken bits the reader needs (0640)
                if owner is not None and os.geteuid() == 0:
                    os.fchown(descriptor, *owner)
                view = memoryview(data)
                while view:
                    view = view[os.write(descriptor, view) :]
                os.fsync(descriptor)
            finally:
                os.close(descriptor)
            os.replace(temporary, path.name, src_dir_fd=directory, dst_dir_fd=directory)
            os.fsync(directory)  # the rename itself: see the docstring
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(temporary, dir_fd=directory)
            raise


def open_lock(path: Path) -> int:
    """A read-write descriptor of lock file `path`, created 0600 if missing and owned like its
    directory (when root); refused when `path` is a symlink, a hard link or not a regular file."""
    with open_directory(path.parent) as directory:
        descriptor = os.open(
            path.name, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o600, dir_fd=directory
        )
        try:
            status = os.fstat(descriptor)
            if not stat.S_ISREG(status.st_mode) or status.st_nlink != 1:
                raise UnsafeFileError(f"{path} is not a plain file (a hard link, a FIFO...): remove it")
            owner = directory_owner(directory)
            if owner is not None and (status.st_uid, status.st_gid) != owner:
                os.fchown(descriptor, *owner)
        except BaseException:
            os.close(descriptor)
            raise
    return descriptor


def read_file(path: Path) -> bytes:
    """The bytes of regular file `path`, not through a symlink (ELOOP) nor from a FIFO (refused):
    root reading a file the service user may have replaced must not copy another file's content."""
    descriptor = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    with os.fdopen(descriptor, "rb") as file:
        if not stat.S_ISREG(os.fstat(file.fileno()).st_mode):
            raise UnsafeFileError(f"{path} is not a regular file")
        return file.read()
