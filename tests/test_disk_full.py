"""A full disk: one line naming the folder and the space left, and nothing half-written (an injected ENOSPC: the
test machine may not allow mounting a small tmpfs)."""
import errno
import os

import pytest
from fairseq import checkpoint_utils

import spanbert_plugin.registry  # noqa: F401  (installs the checkpoint-saving wrapper)
from spanbert_plugin.core.errors import UsageError
from spanbert_plugin.core.file_utils import OutputError, atomic_directory


def test_a_command_output_that_fills_the_disk_is_one_line_and_removed(tmp_path):
    destination = tmp_path / "out"
    with pytest.raises(OutputError) as raised:
        with atomic_directory(str(destination), "spanbert-test") as work:
            with open(os.path.join(work, "part.bin"), "wb") as f:
                f.write(b"half")
            raise OSError(errno.ENOSPC, "No space left on device", os.path.join(work, "part.bin"))
    message = str(raised.value)
    assert message.startswith(f"--destdir {destination}: no space left on the device (") and "MiB free there now" in message
    assert "\n" not in message
    assert list(tmp_path.iterdir()) == []  # no output, no temporary folder


def test_safetensors_full_disk_errors_are_recognised(tmp_path):
    class SafetensorError(Exception):
        pass

    with pytest.raises(OutputError, match="no space left on the device"):
        with atomic_directory(str(tmp_path / "hf"), "spanbert-export-hf", flag="--out"):
            raise SafetensorError("Error while serializing: IoError(Os { code: 28, kind: StorageFull, message: "
                                  "\"No space left on device\" })")


def test_a_checkpoint_save_that_fills_the_disk_leaves_no_tmp_file(tmp_path, monkeypatch):
    path = str(tmp_path / "checkpoint_1_4.pt")

    def fills_the_disk(obj, f):
        f.write(b"x" * 1000)  # fairseq's .tmp is half-written when the device fills
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(checkpoint_utils, "_torch_persistent_save", fills_the_disk)
    with pytest.raises(UsageError) as raised:
        checkpoint_utils.torch_persistent_save({"model": {}}, path)
    assert str(raised.value).startswith(f"saving {path}: no space left on the device (")
    assert os.listdir(tmp_path) == []


def test_another_failed_save_keeps_its_error_and_a_users_tmp_file(tmp_path, monkeypatch):
    path = str(tmp_path / "checkpoint_last.pt")
    (tmp_path / "checkpoint_last.pt.tmp").write_bytes(b"the user's own file")

    def fails(obj, f):
        raise RuntimeError("another failure")

    monkeypatch.setattr(checkpoint_utils, "_torch_persistent_save", fails)
    with pytest.raises(RuntimeError, match="another failure"):
        checkpoint_utils.torch_persistent_save({"model": {}}, path)
    assert os.path.exists(path + ".tmp")  # not created by this save: never removed


def test_a_full_disk_in_fairseq_train_is_one_line_without_a_traceback(tmp_path, caplog, monkeypatch):
    """fairseq logs the traceback of a save that failed three times, then raises: only the one line remains."""
    import logging

    def fills_the_disk(obj, f):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(checkpoint_utils.torch, "save", fills_the_disk)
    with caplog.at_level(logging.INFO), pytest.raises(UsageError):
        checkpoint_utils.torch_persistent_save({"model": {}}, str(tmp_path / "checkpoint_last.pt"))
    assert "Traceback" not in caplog.text
    assert logging.getLogger(checkpoint_utils.__name__).level == logging.NOTSET  # restored


def test_a_copy_onto_checkpoint_last_that_dies_leaves_the_old_file_whole(tmp_path, monkeypatch):
    """fairseq copies checkpoint_E_N.pt onto checkpoint_last.pt; a process killed during the copy (here: the copy
    stops half way) used to leave checkpoint_last.pt truncated. Now it is the old file, or the new one."""
    import shutil

    from fairseq.file_io import PathManager

    new, last = tmp_path / "checkpoint_2_40.pt", tmp_path / "checkpoint_last.pt"
    new.write_bytes(b"n" * 4096)
    last.write_bytes(b"o" * 4096)
    real_copyfile = shutil.copyfile

    def dies_half_way(src, dst):
        with open(dst, "wb") as f:
            f.write(b"n" * 100)
        raise KeyboardInterrupt  # stands for the signal that ends the process

    monkeypatch.setattr(shutil, "copyfile", dies_half_way)
    with pytest.raises(KeyboardInterrupt):
        PathManager.copy(str(new), str(last), overwrite=True)
    assert last.read_bytes() == b"o" * 4096 and sorted(os.listdir(tmp_path)) == [new.name, last.name]
    monkeypatch.setattr(shutil, "copyfile", real_copyfile)
    assert PathManager.copy(str(new), str(last), overwrite=True)
    assert last.read_bytes() == b"n" * 4096 and sorted(os.listdir(tmp_path)) == [new.name, last.name]


def test_a_copy_without_overwrite_keeps_an_existing_destination(tmp_path):
    from fairseq.file_io import PathManager

    src, dst = tmp_path / "checkpoint_2_40.pt", tmp_path / "checkpoint_last.pt"
    src.write_bytes(b"new")
    dst.write_bytes(b"old")
    assert PathManager.copy(str(src), str(dst), overwrite=False) is False
    assert dst.read_bytes() == b"old" and sorted(os.listdir(tmp_path)) == [src.name, dst.name]


def test_a_copy_onto_checkpoint_last_that_fills_the_disk_is_one_line(tmp_path, monkeypatch):
    import shutil

    from fairseq.file_io import PathManager

    new, last = tmp_path / "checkpoint_2_40.pt", tmp_path / "checkpoint_last.pt"
    new.write_bytes(b"n" * 4096)
    last.write_bytes(b"o" * 4096)

    def fills_the_disk(src, dst):
        with open(dst, "wb") as f:
            f.write(b"n" * 100)
        raise OSError(errno.ENOSPC, "No space left on device", dst)

    monkeypatch.setattr(shutil, "copyfile", fills_the_disk)
    with pytest.raises(UsageError) as raised:
        PathManager.copy(str(new), str(last), overwrite=True)
    message = str(raised.value)
    assert message.startswith(f"copying {new} to {last}: no space left on the device (") and "\n" not in message
    assert last.read_bytes() == b"o" * 4096 and sorted(os.listdir(tmp_path)) == [new.name, last.name]


def test_a_copy_between_remote_paths_is_left_to_fairseqs_path_manager():
    """A --save-dir on another file system (an iopath URL) has no local rename: the original copy does it."""
    from spanbert_plugin.core.checkpoint_saving import atomic_copy

    calls = []
    copy = atomic_copy(lambda src, dst, overwrite: calls.append((src, dst, overwrite)) or "copied")
    assert copy("s3://bucket/checkpoint_2_40.pt", "s3://bucket/checkpoint_last.pt", True) == "copied"
    assert calls == [("s3://bucket/checkpoint_2_40.pt", "s3://bucket/checkpoint_last.pt", True)]


def test_a_full_disk_under_parent_folders_the_run_made_still_says_the_space_left(tmp_path):
    """The parents made for a new destination are removed before the message is written: the space left is read
    from the nearest folder that remains (on the same device)."""
    destination = tmp_path / "new" / "deeper" / "out"
    with pytest.raises(OutputError) as raised:
        with atomic_directory(str(destination), "spanbert-test"):
            raise OSError(errno.ENOSPC, "No space left on device")
    message = str(raised.value)
    assert message.startswith(f"--destdir {destination}: no space left on the device (") and "MiB free there now" in message
    assert list(tmp_path.iterdir()) == []


def test_a_full_disk_whose_free_space_cannot_be_read_is_still_one_line(tmp_path, monkeypatch):
    import shutil

    from spanbert_plugin.core.file_utils import disk_full_message

    def unreadable(folder):
        raise PermissionError(errno.EACCES, "Permission denied", folder)

    monkeypatch.setattr(shutil, "disk_usage", unreadable)
    assert disk_full_message("writing out.pt", str(tmp_path)) == (
        "writing out.pt: no space left on the device (its free space unknown); free some space or choose a folder on "
        "another device")
