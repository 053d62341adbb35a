"""How scripts/test spreads the suite over pytest-xdist workers (--dist
loadgroup), and the margins its shared set-ups need on a loaded machine.

- **Spark tests share one worker.** A test that uses the `spark` fixture
  (tests/support/pipeline_fixtures.py), directly or through another fixture,
  joins the xdist group "spark": one JVM per suite, not one per worker. The
  group follows the fixture, so a test that never touches Spark is not queued
  behind the ones that do just because it shares their module.
- **Long work starts first.** loadgroup queues the groups (largest first),
  then every other test in collection order, so a long test collected last
  (tests/test_end_to_end.py) would start when the others are done and run on
  alone. Under loadgroup, tests marked `slow` are moved to the front of
  the collection (a run with -n 0 keeps the files' order).
- **Shared set-ups get time.** The first test of the "docker" group makes the
  base and node images, the first Spark test starts the JVM and builds its
  module's report; pytest-timeout counts that set-up in the test's time. On a
  2-core machine at load 8-16 that took 300 s (the default timeout) and more,
  so those tests get at least SHARED_SETUP_TIMEOUT_S.
- **Groups hold under pytest 9.** pytest-xdist 3.8 tells its scheduler a
  test's group by appending "@GROUP" to the test's node id on the worker,
  through the attribute pytest 8 read the id from; pytest 9 builds the id
  from another one, so the suffix is lost and grouped tests are spread over
  the workers as if unmarked (pytest-xdist issue #1386, open). The last hook
  below appends the suffix where pytest 9 reads it; with a pytest-xdist that
  already did, it does nothing.
"""

from __future__ import annotations

import pytest

SPARK_GROUP = "spark"
DOCKER_GROUP = "docker"
SHARED_SETUP_TIMEOUT_S = 900


def _groups(item: pytest.Item) -> set[str]:
    return {str(m.args[0] if m.args else m.kwargs.get("name", "default"))
            for m in item.iter_markers("xdist_group")}


def _timeout_s(item: pytest.Item, config: pytest.Config) -> float:
    """The timeout pytest-timeout would give the item: its closest mark, else the ini's."""
    mark = item.get_closest_marker("timeout")
    if mark is not None:
        given = mark.args[0] if mark.args else mark.kwargs.get("timeout")
        if given is not None:
            return float(given)
    return float(config.getini("timeout") or 0)


class _GroupsMarginsOrder:
    """A plugin of its own: its hook must run before pytest-xdist's, which
    reads the groups, and the suffix hook below after it."""

    @pytest.hookimpl(tryfirst=True)
    def pytest_collection_modifyitems(self, config: pytest.Config,
                                      items: list[pytest.Item]) -> None:
        for item in items:
            if (SPARK_GROUP in getattr(item, "fixturenames", ())
                    and SPARK_GROUP not in _groups(item)):
                item.add_marker(pytest.mark.xdist_group(SPARK_GROUP))
            if _groups(item) & {SPARK_GROUP, DOCKER_GROUP}:
                timeout = _timeout_s(item, config)
                if 0 < timeout < SHARED_SETUP_TIMEOUT_S:
                    item.add_marker(pytest.mark.timeout(SHARED_SETUP_TIMEOUT_S))
        if config.getoption("loadgroup", default=False):  # a worker of scripts/test
            items.sort(key=lambda item: item.get_closest_marker("slow") is None)  # stable


def pytest_configure(config: pytest.Config) -> None:
    config.pluginmanager.register(_GroupsMarginsOrder(), "dlab-groups-margins-order")


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not config.getoption("loadgroup", default=False):
        return  # not a loadgroup worker (the controller, or no xdist)
    try:
        from _pytest.nodeid import coerce_node_id
    except ImportError:  # pytest 8: pytest-xdist's own suffix holds
        return
    for item in items:
        names = _groups(item)
        suffix = "@" + "_".join(sorted(names))
        if names and not item.nodeid.endswith(suffix):
            item._id = coerce_node_id(item.nodeid + suffix)  # type: ignore[attr-defined]
