"""The controller state's JSON form, versioned, for a controller process to
persist durably (write, fsync, rename: the wrapper's job, not this module's).

Layout, version 1:
    {"format": "dlab-controller-state", "version": 1,
     "members": [{"name": "n1", "broker_id": 1}, ...],   # sorted by id
     "next_id": 3, "master": 1 | null, "master_epoch": 4,
     "sync_state_set": [1, 2], "sync_state_set_epoch": 7}
Heartbeats are left out: they are times on the writing process's clock
(state.py). A restored controller judges a broker's liveness only once it
has heartbeaten to it.

`from_json` takes untrusted text: anything that is not a well-formed version-1
state breaking no invariant raises ControllerStateError naming the problem.
"""

from __future__ import annotations

import json
from typing import Any

from ha.controller.state import ControllerState, Member, problems

FORMAT = "dlab-controller-state"
VERSION = 1


class ControllerStateError(ValueError):
    """A persisted controller state cannot be read; the message says why."""


def to_json(state: ControllerState) -> str:
    doc = {
        "format": FORMAT,
        "version": VERSION,
        "members": [{"name": m.name, "broker_id": m.broker_id} for m in state.members],
        "next_id": state.next_id,
        "master": state.master,
        "master_epoch": state.master_epoch,
        "sync_state_set": sorted(state.sync_state_set),
        "sync_state_set_epoch": state.sync_state_set_epoch,
    }
    return json.dumps(doc, indent=1, sort_keys=True) + "\n"


def _int(doc: dict[str, Any], key: str, *, nullable: bool = False) -> Any:
    value = doc.get(key)
    if value is None and nullable and key in doc:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise ControllerStateError(f"controller state: {key!r} must be a whole number, "
                                   f"not {value!r}")
    return value


def from_json(text: str) -> ControllerState:
    try:
        doc = json.loads(text)
    except ValueError as e:
        raise ControllerStateError(f"controller state is not JSON ({e}): the file is "
                                   "damaged; restore it from a copy") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise ControllerStateError(f"not a controller state file (no \"format\": {FORMAT!r})")
    if doc.get("version") != VERSION:
        raise ControllerStateError(f"controller state version {doc.get('version')!r} is not "
                                   f"supported (this build reads version {VERSION})")
    raw_members = doc.get("members")
    raw_set = doc.get("sync_state_set")
    if not isinstance(raw_members, list) or not isinstance(raw_set, list):
        raise ControllerStateError("controller state: 'members' and 'sync_state_set' "
                                   "must be lists")
    members = []
    for raw in raw_members:
        if not isinstance(raw, dict) or not isinstance(raw.get("name"), str):
            raise ControllerStateError(f"controller state: bad member {raw!r} "
                                       "(needs a name and a broker_id)")
        members.append(Member(raw["name"], _int(raw, "broker_id")))
    set_ids = [_int({"member": b}, "member") for b in raw_set]
    state = ControllerState(
        members=tuple(sorted(members, key=lambda m: m.broker_id)),
        next_id=_int(doc, "next_id"), master=_int(doc, "master", nullable=True),
        master_epoch=_int(doc, "master_epoch"), sync_state_set=frozenset(set_ids),
        sync_state_set_epoch=_int(doc, "sync_state_set_epoch"))
    broken = problems(state)
    if broken:
        raise ControllerStateError("controller state is inconsistent: " + "; ".join(broken))
    return state
