"""``fsm inspect``: registered like the other subcommands, binds 127.0.0.1, creates nothing."""

from __future__ import annotations

from pathlib import Path

import pytest

from fsm.cli import build_parser, main


def test_inspect_is_a_subcommand_binding_localhost_by_default() -> None:
    args = build_parser().parse_args(["inspect", "--db", "sqlite:///fsm.db"])
    assert (args.host, args.port, args.prefix) == ("127.0.0.1", 8765, "fsm_")
    assert build_parser().parse_args(["inspect", "--db", "x", "--host", "0.0.0.0"]).host == "0.0.0.0"


def test_a_missing_database_is_refused_and_nothing_is_created(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("uvicorn")
    missing = tmp_path / "none.db"
    assert main(["inspect", "--db", f"sqlite:///{missing}"]) == 2
    assert not missing.exists()
    assert "no database file" in capsys.readouterr().err
    assert main(["inspect", "--db", "memory://"]) == 2
