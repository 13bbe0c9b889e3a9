"""A session's directories as tar archives, in the agent (see agent.py's ``pack`` and
``unpack`` requests). The agent carries this source as a string and compiles it on the first
request that needs it, with its own path helpers put into this module's namespace first
(``open_parent``, ``open_dir_step``, ``write_file``), so
that every path follows the files API's rule: walked from / one component at a time, never
through a symlink.

``pack`` stores the tree as ``tar`` itself would, symlinks as symlinks, names relative to the
directory. ``unpack`` checks the whole archive before it writes anything: a member with an
absolute name or a ``..`` component, a hard link, a device or a FIFO, or contents beyond the
limit refuse the archive (EINVAL, EFBIG), and nothing is written. Regular files keep their
permission bits (setuid, setgid and sticky dropped), directories are made as needed, symlinks
are made as they are (what they point to is never followed by a file op).
"""

import errno
import io
import os
import stat
import tarfile


def pack(path, limit):
    """The directory at path as an uncompressed tar archive; EFBIG past limit bytes. It stays
    on the directory's own filesystem, as ``tar --one-file-system``: a volume mounted beneath
    it is archived as its empty mount point, never its contents (a snapshot's files are the
    sandbox's own; a volume is not copied into a fork)."""
    fd, name = open_parent(path)  # noqa: F821 (put here by the agent)
    try:
        os.close(open_dir_step(fd, name, False))  # noqa: F821: the directory itself, no link
    finally:
        os.close(fd)
    total = 0

    def bounded(info):
        nonlocal total
        total += info.size + tarfile.BLOCKSIZE
        if total > limit:
            raise OSError(errno.EFBIG, f"the archive would be larger than {limit} bytes")
        return info

    out = io.BytesIO()
    device = os.lstat(path).st_dev
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        # Depth first, each directory before what it holds; a stack, not recursion, so that
        # no depth of tree exhausts Python's.
        todo = [(os.path.join(path, e), e) for e in sorted(os.listdir(path), reverse=True)]
        while todo:
            full, arcname = todo.pop()
            tar.add(full, arcname=arcname, recursive=False, filter=bounded)
            st = os.lstat(full)
            if stat.S_ISDIR(st.st_mode) and st.st_dev == device:
                inner = sorted(os.listdir(full), reverse=True)
                todo.extend((os.path.join(full, e), f"{arcname}/{e}") for e in inner)
    return out.getvalue()


def unpack(path, data, limit):
    """Extracts a tar archive (compressed or not) under the directory path; returns the
    number of bytes of file contents written."""
    try:
        tar = tarfile.open(fileobj=io.BytesIO(data), mode="r:*")
        members = tar.getmembers()
    except (tarfile.TarError, EOFError, OSError) as exc:
        raise OSError(errno.EINVAL, not_a_tar(exc)) from None
    plan = [(member, target(path, member)) for member in members]
    total = sum(m.size for m, _ in plan if m.isreg())
    if total > limit:
        raise OSError(errno.EFBIG, f"the archive holds {total} bytes, more than {limit}")
    make_dirs(path)
    for member, dest in plan:
        if dest is None:
            continue
        if member.isdir():
            make_dirs(dest)
        elif member.isreg():
            contents = tar.extractfile(member).read()
            write_file(dest, contents, member.mode & 0o777)  # noqa: F821
        else:
            make_link(dest, member.linkname)
    return total


def not_a_tar(exc):
    """One line for data tarfile cannot read. When no way of opening it works, tarfile's
    message lists each way it tried (gzip, bzip2, xz, plain tar), one per line: that says
    only that the data is no archive of any of them."""
    why = str(exc).strip()
    if not why or "\n" in why:
        return "not a tar archive (plain, gzip, bzip2 or xz)"
    return f"not a tar archive: {why}"


def target(root, member):
    """Where a member goes (None for the root itself), refusing what the files API would."""
    name = member.name
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if name.startswith("/") or ".." in parts or "\0" in name:
        raise OSError(errno.EINVAL, f"{name!r}: an absolute name or one with '..' is not extracted")
    if not (member.isdir() or member.isreg() or member.issym()):
        kind = "a hard link" if member.islnk() else "a device or FIFO"
        raise OSError(errno.EINVAL, f"{name!r} is {kind}, which is not extracted")
    return os.path.join(root, *parts) if parts else None


def make_dirs(path):
    fd = open_parent(path + "/.", create=True)[0]  # noqa: F821
    os.close(fd)


def make_link(path, link):
    fd, name = open_parent(path, create=True)  # noqa: F821
    try:
        try:
            mode = os.lstat(name, dir_fd=fd).st_mode
        except FileNotFoundError:
            mode = None
        if mode is not None and stat.S_ISDIR(mode):
            raise OSError(errno.EISDIR, f"{path} is a directory")
        if mode is not None:
            os.unlink(name, dir_fd=fd)
        os.symlink(link, name, dir_fd=fd)
    finally:
        os.close(fd)
