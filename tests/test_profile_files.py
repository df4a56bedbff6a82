"""Capability profile files are read safely: the exact path, regular files only, bounded, and
every problem a ProfileError naming the file (and the key and value where there is one)."""

from __future__ import annotations

import os

import pytest

import torch_adapter
from torch_adapter.errors import ProfileError
from torch_adapter.routing.profiles import load_profile


def test_the_path_is_used_exactly_as_spelled(tmp_path):
    (tmp_path / "Good.toml").write_text('name = "upper"\nbase = "mps"\n')
    (tmp_path / "good.toml").write_text('name = "lower"\nbase = "cpu"\n')
    assert load_profile(tmp_path / "Good.toml").name == "upper"
    session = torch_adapter.install(target=str(tmp_path / "Good.toml"), simulate=True)
    assert session.target.name == "upper"


@pytest.mark.parametrize("kind, pattern", [
    ("fifo", "it is a FIFO"), ("folder", "it is a folder"), ("device", "it is a character device"),
    ("latin1", r"it is not UTF-8 text \(byte 6, line 1\)"), ("huge", "at most"),
])
def test_unreadable_profiles_are_profile_errors(tmp_path, kind, pattern):
    path = tmp_path / "p.toml"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "folder":
        path.mkdir()
    elif kind == "device":
        path = tmp_path / "zero.toml"
        path.symlink_to("/dev/zero")
    elif kind == "latin1":
        path.write_bytes(b'name="\xe9t\xe9"\n')
    elif kind == "huge":
        with open(path, "wb") as fh:
            fh.truncate(9 * 1024 * 1024)
    with pytest.raises(ProfileError, match=pattern) as info:
        load_profile(path)
    assert f"capability profile {str(path)!r}" in str(info.value) and "Fix:" in str(info.value)


def test_an_unknown_dispatch_key_is_an_error_with_the_close_one(tmp_path):
    path = tmp_path / "p.toml"
    path.write_text('name = "n"\ndispatch_key = "privateuse1"\n')
    with pytest.raises(ProfileError, match=r"(?s)key 'dispatch_key': expected a backend dispatch key of this torch "
                                           r"\(CPU, CUDA.*got 'privateuse1' \(str\).*Fix: use 'PrivateUse1'"):
        load_profile(path)
    path.write_text('name = "n"\ndispatch_key = "PrivateUse1"\n')
    assert load_profile(path).dispatch_key == "PrivateUse1"
