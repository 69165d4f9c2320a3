"""The folders the docker runner lets its container write into (trace, work, measure) are shared
with the container's user only, never with every local user (another user could plant trace
files that get converted and trained on).

The container runs as nobody (RUN_UID:RUN_GID), the same ids on the host under a rootful engine:
a process with those ids (and, where the runner shares through a group, that group added as the
engine's `group_add` does) stands in for it here; a third user must be refused.
"""

from __future__ import annotations

import os
import stat
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tasks.replay.runners.base import RUN_GID, RUN_UID
from tasks.replay.runners.docker_runner import share_with_run_user
from tests.conftest import in_ci

OTHER_UID = RUN_UID - 1  # a local user that is neither us nor the container's


def write_as(uid: int, gid: int, groups: list[int], folder: Path, name: str) -> bool:
    """Whether a process with these ids may create a file in `folder`."""
    setpriv = [
        "setpriv",
        f"--reuid={uid}",
        f"--regid={gid}",
        f"--groups={','.join(map(str, groups))}" if groups else "--clear-groups",
    ]
    return subprocess.run([*setpriv, "touch", str(folder / name)]).returncode == 0


@pytest.fixture
def loose_folder() -> Iterator[Path]:
    """A folder as a caller with umask 0 would create it: mode 777 before the runner's say."""
    if os.geteuid() != 0:
        msg = "switching to the container's and another user's ids (setpriv) needs root"
        if in_ci():
            pytest.fail(msg)
        pytest.skip(msg)
    # under /tmp, not pytest's tmp_path (mode 700 up the tree): the other ids must reach it
    with tempfile.TemporaryDirectory(prefix="heapcast-share-") as parent:
        Path(parent).chmod(0o755)
        old = os.umask(0)
        try:
            folder = Path(parent) / "trace"
            folder.mkdir(0o777)
        finally:
            os.umask(old)
        assert folder.stat().st_mode & stat.S_IWOTH
        yield folder


def test_a_root_caller_gives_the_folder_to_the_container_user(loose_folder):
    # WHEN the runner (as root) shares the folder
    group = share_with_run_user(loose_folder)
    # THEN the container's user owns it, no group is added, and no one else may write there
    st = loose_folder.stat()
    assert group is None
    assert (st.st_uid, st.st_gid) == (RUN_UID, RUN_GID)
    assert not st.st_mode & (stat.S_IWOTH | stat.S_IWGRP)
    assert write_as(RUN_UID, RUN_GID, [], loose_folder, "container")
    assert not write_as(OTHER_UID, OTHER_UID, [], loose_folder, "planted")


def test_another_caller_shares_the_folder_through_its_group_never_with_everyone(
    loose_folder, monkeypatch
):
    # GIVEN a caller that is not root (it cannot give a folder away)
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    # WHEN the runner shares the folder
    group = share_with_run_user(loose_folder)
    # THEN the folder stays ours, in our group (setgid: the container's files stay in it),
    # nothing for others; the container's user, given that group, may write; another user not
    st = loose_folder.stat()
    assert group == os.getegid() == st.st_gid
    assert stat.S_IMODE(st.st_mode) == 0o2770
    assert write_as(RUN_UID, RUN_GID, [group], loose_folder, "container")
    assert (loose_folder / "container").stat().st_gid == group
    assert not write_as(OTHER_UID, OTHER_UID, [], loose_folder, "planted")
    assert not (loose_folder / "planted").exists()
