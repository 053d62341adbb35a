"""Makes `xdist_group` marks hold under pytest 9 (scripts/test runs the
suite with pytest-xdist, --dist loadgroup).

pytest-xdist 3.8 tells its scheduler a test's group by appending "@GROUP"
to the test's node id on the worker, through the attribute pytest 8 read
the id from; pytest 9 builds the id from another one, so the suffix is lost
and grouped tests are spread over the workers as if unmarked (pytest-xdist
issue #1386, open). This hook appends the suffix where pytest 9 reads it;
with a pytest-xdist that already did, it does nothing."""

from __future__ import annotations

import pytest


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not config.getoption("loadgroup", default=False):
        return  # not a loadgroup worker (the controller, or no xdist)
    try:
        from _pytest.nodeid import coerce_node_id
    except ImportError:  # pytest 8: pytest-xdist's own suffix holds
        return
    for item in items:
        names = {str(m.args[0] if m.args else m.kwargs.get("name", "default"))
                 for m in item.iter_markers("xdist_group")}
        suffix = "@" + "_".join(sorted(names))
        if names and not item.nodeid.endswith(suffix):
            item._id = coerce_node_id(item.nodeid + suffix)  # type: ignore[attr-defined]
