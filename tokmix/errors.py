"""The one exception type for failures a user can act on; the CLI prints it as one line. Also the one wording
of an operating system's refusal (a full disk, a permission) as such a line."""

import errno

DISK_FULL = (errno.ENOSPC, errno.EFBIG, errno.EDQUOT)


class TokmixError(Exception):
    """A user-facing failure: bad input, a recipe problem, a source that runs out, no disk space."""


def os_error_message(e: OSError, where: object = "") -> str:
    """An OSError as one line naming the file: a full disk says that committed work is kept and how to resume
    (every file is committed by a rename, so what was being written is the only loss)."""
    path = e.filename or where
    if e.errno in DISK_FULL:
        return (f"no space left writing {path} ({e.strerror}); committed work is kept: free some space and run "
                "the same command again to resume")
    return f"{path}: {e.strerror or e}" if path else f"{e.strerror or e}"
