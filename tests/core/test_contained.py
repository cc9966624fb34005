"""hsextract.contained: a path another party names is read, linked or removed only as a regular file
inside its directory, reached without following a link; nothing outside is ever touched."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hsextract.contained import (
    UnsafePath,
    checked_parts,
    irregular_entries,
    link_regular,
    open_regular,
    read_regular,
    unlink_regular,
)


@pytest.fixture
def tree(tmp_path: Path) -> tuple[Path, Path]:
    """(root, outside): root/d/f.txt a regular file, outside/secret.txt a file no reader may reach."""
    root, outside = tmp_path / "root", tmp_path / "outside"
    (root / "d").mkdir(parents=True)
    (root / "d" / "f.txt").write_text("inside")
    outside.mkdir()
    (outside / "secret.txt").write_text("secret")
    return root, outside


@pytest.mark.parametrize(
    "name",
    [
        "",
        "/etc/hostname",
        "../outside/secret.txt",
        "d/../../outside/secret.txt",
        "d//f.txt",
        "./d/f.txt",
        "d/f.txt\0",
        None,
        3,
    ],
)
def test_a_name_that_is_no_plain_relative_path_is_refused_before_anything_is_opened(name):
    with pytest.raises(UnsafePath):
        checked_parts(name)


def test_a_regular_file_inside_is_read(tree):
    root, _ = tree
    assert read_regular(root, "d/f.txt") == b"inside"


@pytest.mark.parametrize("where", ["file", "directory"])
def test_a_link_anywhere_on_the_way_is_not_followed(where, tree):
    root, outside = tree
    if where == "file":
        (root / "d" / "link.txt").symlink_to(outside / "secret.txt")
        name = "d/link.txt"
    else:
        (root / "e").symlink_to(outside)
        name = "e/secret.txt"
    with pytest.raises(UnsafePath, match="symbolic link"):
        read_regular(root, name)
    with pytest.raises(UnsafePath, match="symbolic link"):
        unlink_regular(root, name)
    with pytest.raises(UnsafePath, match="symbolic link"):
        link_regular(root, name, root / "linked")
    assert (outside / "secret.txt").read_text() == "secret" and not (root / "linked").exists()


def test_a_fifo_is_refused_without_blocking(tree):
    root, _ = tree
    os.mkfifo(root / "d" / "pipe")
    with pytest.raises(UnsafePath, match="a FIFO, not a regular file"):
        open_regular(root, "d/pipe")


def test_unlink_removes_a_regular_file_inside_and_reports_one_that_is_gone(tree):
    root, _ = tree
    assert unlink_regular(root, "d/f.txt") is True
    assert not (root / "d" / "f.txt").exists()
    assert unlink_regular(root, "d/f.txt") is False
    assert unlink_regular(root, "gone/f.txt") is False


def test_a_hard_link_is_made_to_the_file_itself(tree):
    root, _ = tree
    link_regular(root, "d/f.txt", root / "linked")
    assert os.stat(root / "linked").st_ino == os.stat(root / "d" / "f.txt").st_ino


def test_the_scan_names_every_link_and_special_file_below_the_names_given(tree):
    root, outside = tree
    (root / "d" / "e").mkdir()
    (root / "d" / "e" / "link").symlink_to(outside / "secret.txt")
    os.mkfifo(root / "d" / "pipe")
    (root / "top").symlink_to(outside)
    assert irregular_entries(root, ["d", "top", "missing"]) == [
        "d/e/link is a symbolic link",
        "d/pipe is a FIFO",
        "top is a symbolic link",
    ]
