"""`dlab bench ...` refuses bad arguments with exit 2 and a message naming
the problem, before it writes anything: a missing work directory, counts,
sizes and durations that are zero or negative, bodies the store would
refuse. (Each of these ended in a traceback or a meaningless ratio.)"""

from __future__ import annotations

import os

import pytest

from chaos.cli import build_parser


def _refused(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as exc:
        build_parser().parse_args(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return err


@pytest.mark.parametrize("bench", ["store", "group-commit", "recovery", "catch-up",
                                   "sync-master", "pipeline"])
def test_a_missing_workdir_is_named(bench: str, tmp_path: str,
                                    capsys: pytest.CaptureFixture[str]) -> None:
    missing = os.path.join(tmp_path, "not-made")
    err = _refused(["bench", bench, "--workdir", missing], capsys)
    assert f"'{missing}' is not a directory; create it first" in err
    assert not os.path.exists(missing)


def test_a_workdir_that_is_a_file_is_named(tmp_path: str,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    path = os.path.join(tmp_path, "a-file")
    with open(path, "w") as f:
        f.write("x")
    assert "is not a directory" in _refused(["bench", "store", "--workdir", path], capsys)


@pytest.mark.parametrize("args, message", [
    (["store", "--mib", "0"], "0 must be at least 1"),
    (["store", "--batch", "-4"], "-4 must be at least 1"),
    (["store", "--rounds", "two"], "'two' is not a whole number"),
    (["store", "--body-size", "-5"], "'-5' is not a size"),
    (["group-commit", "--producers", "0"], "0 must be at least 1"),
    (["group-commit", "--seconds", "-1"], "-1 must be more than 0"),
    (["group-commit", "--seconds", "0"], "0 must be more than 0"),
    (["group-commit", "--seconds", "nan"], "nan must be more than 0"),
    (["group-commit", "--body-size", "5MiB"], "over the store's max_message_size"),
    (["recovery", "--mib", "0"], "0 must be at least 1"),
])
def test_bad_store_bench_arguments_are_named(args: list[str], message: str,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    assert message in _refused(["bench", *args], capsys)


def test_good_store_bench_arguments_parse(tmp_path: str) -> None:
    args = build_parser().parse_args(["bench", "group-commit", "--workdir", str(tmp_path),
                                      "--seconds", "0.5", "--producers", "8",
                                      "--body-size", "4MiB"])
    assert (args.workdir, args.seconds, args.producers, args.body_size) == (
        str(tmp_path), 0.5, 8, 4 * 1024 * 1024)
