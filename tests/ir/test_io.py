"""The one writer of every output (:func:`shardplan.ir.io.write_atomic`): never an input,
never through a symbolic link out of its folder, device nodes and FIFOs written in place."""

from __future__ import annotations

import os
import select
import stat
import threading
from pathlib import Path

import pytest

from shardplan.errors import OutputError
from shardplan.ir.io import command_scope, declare_inputs, read_text, write_atomic


def test_a_regular_file_is_replaced_atomically(tmp_path: Path) -> None:
    out = tmp_path / "a.json"
    out.write_text("old")
    write_atomic(out, "new")
    assert out.read_text() == "new"
    assert [p.name for p in tmp_path.iterdir()] == ["a.json"]  # no temporary file left


def test_an_input_read_or_declared_is_never_an_output(tmp_path: Path) -> None:
    read, declared, other = (tmp_path / n for n in ("r.json", "d.py", "o.json"))
    for p in (read, declared):
        p.write_text("x")
    with command_scope():
        read_text(read)
        declare_inputs(f"{declared}:build")  # a model spec names its file
        for p in (read, declared):
            with pytest.raises(OutputError, match="one of this command's inputs"):
                write_atomic(p, "y")
            assert p.read_text() == "x"
        write_atomic(other, "z")
    write_atomic(read, "y")  # out of a command, a library user may save over what it read
    assert read.read_text() == "y"


def test_a_hard_link_or_another_spelling_of_an_input_is_refused(tmp_path: Path) -> None:
    src = tmp_path / "g.json"
    src.write_text("x")
    os.link(src, tmp_path / "hard.json")
    (tmp_path / "sub").mkdir()
    with command_scope():
        declare_inputs(str(src))
        for name in ("hard.json", "sub/../g.json"):
            with pytest.raises(OutputError):
                write_atomic(tmp_path / name, "y")
    assert src.read_text() == "x"


def test_a_symlink_out_of_its_folder_is_refused(tmp_path: Path) -> None:
    (tmp_path / "in").mkdir()
    outside = tmp_path / "secret.txt"
    outside.write_text("keep")
    link = tmp_path / "in" / "out.json"
    link.symlink_to(outside)
    with pytest.raises(OutputError, match="symbolic link .* outside its folder"):
        write_atomic(link, "y")
    assert outside.read_text() == "keep" and link.is_symlink()
    dangling = tmp_path / "in" / "new.json"
    dangling.symlink_to(tmp_path / "nowhere.json")
    with pytest.raises(OutputError):
        write_atomic(dangling, "y")
    assert not (tmp_path / "nowhere.json").exists()


def test_a_symlink_within_its_folder_writes_its_target(tmp_path: Path) -> None:
    target = tmp_path / "plan-v2.json"
    target.write_text("old")
    link = tmp_path / "plan.json"
    link.symlink_to("plan-v2.json")
    write_atomic(link, "new")
    assert link.is_symlink() and target.read_text() == "new"


def test_a_fifo_is_written_in_place_or_refused_without_a_reader(tmp_path: Path) -> None:
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    with pytest.raises(OutputError, match="no reader"):
        write_atomic(fifo, "y")
    got: list[bytes] = []
    ready = threading.Event()

    def reader() -> None:
        fd = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # a reader, as `cat fifo` is
        ready.set()
        select.select([fd], [], [], 10)  # no end of file before a writer came (Linux)
        os.set_blocking(fd, True)
        with os.fdopen(fd, "rb") as fh:
            got.append(fh.read())

    t = threading.Thread(target=reader)
    t.start()
    ready.wait(10)
    write_atomic(fifo, "hello" * 20000)  # more than a pipe holds: the reader drains it
    t.join(10)
    assert got == [b"hello" * 20000]
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)


def test_a_character_device_is_written_in_place(tmp_path: Path) -> None:
    node = tmp_path / "null"
    try:
        os.mknod(node, stat.S_IFCHR | 0o666, os.makedev(1, 3))  # /dev/null's numbers
        os.open(node, os.O_WRONLY)
    except OSError:
        pytest.skip("cannot make or open a device node here (not root, or nodev)")
    write_atomic(node, "discarded")
    assert stat.S_ISCHR(os.lstat(node).st_mode)


def test_a_folder_is_refused(tmp_path: Path) -> None:
    with pytest.raises(OutputError, match="folder"):
        write_atomic(tmp_path, "x")
