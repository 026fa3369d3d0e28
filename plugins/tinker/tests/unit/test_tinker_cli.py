"""``astraflow tinker``'s set-up mistakes stop it with one line naming what and where."""

from __future__ import annotations

import socket

import pytest
from astraflow_tinker.cli import main, read_keys

pytestmark = pytest.mark.unit


def stops(argv: list[str]) -> str:
    with pytest.raises(SystemExit) as stopped:
        main(argv)
    message = str(stopped.value.code)
    assert message.startswith("astraflow tinker: ") and "\n" not in message
    return message


def test_keys_come_from_the_file_or_the_environment(tmp_path, monkeypatch):
    keys = tmp_path / "keys.txt"
    keys.write_text("# ours\ntml-first-key\n\ntml-second-key\n")
    assert read_keys(str(keys)) == ["tml-first-key", "tml-second-key"]
    monkeypatch.setenv("TINKER_API_KEY", "tml-from-env")
    assert read_keys(None) == ["tml-from-env"]


def test_each_set_up_mistake_is_named(tmp_path, monkeypatch, chat_model_dir):
    monkeypatch.delenv("TINKER_API_KEY", raising=False)
    base = ["--model", chat_model_dir, "--state", str(tmp_path / "state")]
    assert "TINKER_API_KEY" in stops(base)
    assert "no-such.txt: no such file" in stops([*base, "--keys", str(tmp_path / "no-such.txt")])
    bad = tmp_path / "bad.txt"
    bad.write_text("sk-not-a-tinker-key\n")
    assert "must start with 'tml-'" in stops([*base, "--keys", str(bad)])
    good = tmp_path / "good.txt"
    good.write_text("tml-a-good-key\n")
    assert "no config.json" in stops(["--model", str(tmp_path), "--state", str(tmp_path),
                                      "--keys", str(good)])
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert f"cannot listen on 127.0.0.1:{port}" in stops(
            [*base, "--keys", str(good), "--port", str(port)])
