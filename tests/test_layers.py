"""The CLI respects the layers at run time too. lint-imports (scripts/test)
checks the static imports; a command module loaded by name (importlib) is
invisible to it, so these tests load the entries and look at what came in."""

from __future__ import annotations

import argparse
import importlib
import json
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _subcommands(parser: object) -> dict[str, list[str]]:
    """{command: [its subcommands]} of an argparse parser, for `bench`'s."""
    assert isinstance(parser, argparse.ArgumentParser)
    top = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return {name: [n for a in p._actions if isinstance(a, argparse._SubParsersAction)
                   for n in a.choices]
            for name, p in top.choices.items()}


def test_the_dlab_script_has_every_areas_commands() -> None:
    script = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]["dlab"]
    module, _, func = script.partition(":")
    entry = importlib.import_module(module)
    assert callable(getattr(entry, func))
    commands = _subcommands(entry.build_parser())
    assert {"store", "node", "send", "consume", "cluster", "image", "report",
            "chaos"} <= set(commands)
    assert {"store", "group-commit", "recovery", "catch-up", "sync-master",
            "pipeline"} <= set(commands["bench"])


def test_the_node_entry_loads_no_chaos_module() -> None:
    """`python -m cluster.cli` (how backends start nodes) builds its parser
    without loading the layer above it."""
    code = ("import json, sys; from cluster.cli import main as cli; cli.build_parser(); "
            "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] == 'chaos')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, check=True, cwd=ROOT)
    assert json.loads(out.stdout) == []


def test_each_area_declares_the_commands_its_module_registers() -> None:
    """cluster.cli.main.Area names its commands so that a command line loads
    only its own area: the names must be what the module really adds."""
    from chaos.cli import REGISTER
    from cluster.cli.main import Area

    assert all(isinstance(a, Area) for a in REGISTER)
    for area in REGISTER:
        parser = argparse.ArgumentParser()
        sub = parser.add_subparsers(dest="command")
        bench = sub.add_parser("bench").add_subparsers(dest="bench")
        area(sub, bench)
        assert (sorted(set(sub.choices) - {"bench"}), sorted(bench.choices)) == (
            sorted(area.commands), sorted(area.benchmarks)), area.module


@pytest.mark.parametrize("argv, loaded, not_loaded", [
    (["node", "--help"], "cluster.cli.node_command", "cluster.bench"),
    (["cluster", "status"], "cluster.cli.cluster_commands", "store.tools.bench"),
    (["bench", "catch-up"], "cluster.bench.replication", "cluster.cli.commands"),
    (["chaos", "run"], "chaos.commands.run", "chaos.bench.sim"),
])
def test_a_command_line_loads_only_its_own_area(argv: list[str], loaded: str,
                                                not_loaded: str) -> None:
    """A node start (`python -m cluster.cli node`, at every start of every
    node of every run) or a `dlab cluster` call imports no benchmark or
    harness it does not run; `--help` and an unknown command still see all."""
    code = ("import json, sys; from chaos import cli; "
            f"parser = cli.cli.build_parser(cli.REGISTER, {argv!r}); "
            "top = next(a for a in parser._actions if hasattr(a, 'choices') and a.choices); "
            "print(json.dumps([sorted(sys.modules), sorted(top.choices)]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, check=True, cwd=ROOT)
    modules, commands = json.loads(out.stdout)
    assert loaded in modules and not_loaded not in modules
    assert argv[0] in commands
    code = ("import json, sys; from chaos import cli; "
            "parser = cli.cli.build_parser(cli.REGISTER, ['nonsense']); "
            "print(json.dumps(sorted(sys.modules)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, check=True, cwd=ROOT)
    assert {loaded, not_loaded} <= set(json.loads(out.stdout))


@pytest.mark.parametrize("entry, command_module", [
    ("cluster.cli.main", "cluster.cli.image"),
    ("cluster.cli.main", "cluster.cli.bench"),
    ("chaos.cli", "chaos.commands.report"),
])
def test_a_command_module_that_cannot_be_imported_stops_the_cli(
        entry: str, command_module: str) -> None:
    """A command module that fails to import is an error with its name, never
    a CLI that starts without its commands (as a lookup by name that skipped
    missing modules once did)."""
    code = (f"import sys; sys.modules[{command_module!r}] = None; "
            f"import {entry} as entry; entry.build_parser(); print('started')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, cwd=ROOT)
    assert out.returncode != 0 and "started" not in out.stdout
    assert command_module in out.stderr


def test_dlab_starts_without_the_report_stack() -> None:
    """The node image leaves out the report stack (compose/node-excludes.txt),
    so every module `dlab` loads at start must import it lazily; the image
    test catches a top-level import only where Docker runs, this one
    everywhere."""
    excluded = [line.strip() for line in
                (Path(__file__).resolve().parents[1] / "compose" / "node-excludes.txt")
                .read_text().splitlines() if line.strip() and not line.startswith("#")]
    code = ("import sys\n"
            f"for m in {excluded!r}: sys.modules[m] = None\n"
            "import chaos.cli\n"
            "sys.exit(chaos.cli.main(['--help']))\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=120, check=False)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert "chaos" in r.stdout


def _lint_imports_with(tmp_path: Path, module: str, line: str) -> subprocess.CompletedProcess[str]:
    """lint-imports over a copy of the packages with `line` appended to
    `module`'s file: the contracts judged on a planted import."""
    for pkg in ("store", "ha", "proto", "cluster", "chaos"):
        shutil.copytree(ROOT / pkg, tmp_path / pkg,
                        ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    target = tmp_path / (module.replace(".", "/") + ".py")
    target.write_text(target.read_text() + f"\n{line}\n")
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    lint = Path(sys.executable).with_name("lint-imports")
    return subprocess.run([str(lint), "--no-logo"], capture_output=True, text=True,
                          timeout=300, cwd=tmp_path, env=env)


@pytest.mark.parametrize("module, line", [
    ("store.log.segments", "import store.sim.memory_disk  # noqa"),
    ("cluster.node.server", "from ha.transport.memory import MemoryNetwork  # noqa"),
    ("ha.master", "from store.sim.loop import VirtualTimeLoop  # noqa"),
])
def test_the_twins_contract_fails_on_a_planted_import(tmp_path: Path, module: str,
                                                      line: str) -> None:
    """Production modules may not import a simulation twin (pyproject.toml,
    "Twins fenced off"): planting one such import breaks that contract."""
    r = _lint_imports_with(tmp_path, module, line)
    assert r.returncode != 0, r.stdout[-2000:]
    broken = r.stdout[r.stdout.index("Broken contracts"):]
    assert "Twins fenced off" in broken and module in broken, broken[:2000]


def test_the_contracts_hold_on_the_tree_as_it_is(tmp_path: Path) -> None:
    """The same copy with a harmless line keeps every contract: the planted
    import above, not the copy, is what breaks it."""
    r = _lint_imports_with(tmp_path, "store.log.segments", "# nothing planted")
    assert r.returncode == 0, r.stdout[-2000:]


def test_the_tests_mirror_the_packages() -> None:
    """Tests live in the folder of the package they cover (tests/store/,
    tests/ha/, ...; tests/support/ holds the shared helpers), and no test
    module imports another: what tests share is a helper in tests/support/."""
    tests = ROOT / "tests"
    packages = {"store", "ha", "cluster", "chaos", "proto"}
    misplaced = [p.relative_to(tests).as_posix() for p in tests.rglob("test_*.py")
                 if p.parent != tests and p.relative_to(tests).parts[0] not in packages]
    assert misplaced == []
    top = sorted(p.name for p in tests.glob("test_*.py"))
    assert top == ["test_end_to_end.py", "test_layers.py"], top
    cross = [f"{p.relative_to(tests)}: {line.strip()}"
             for p in tests.rglob("*.py")
             for line in p.read_text().splitlines()
             if line.lstrip().startswith(("from test_", "import test_"))]
    assert cross == []
