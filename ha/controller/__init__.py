"""Controller mode (RocketMQ 5's automatic failover), sans IO.

The controller's decisions as a pure state machine: `machine.step` takes the
state, one request and the time, and returns the new state and decisions as
data. No clock, no sockets, no files, no randomness; a controller process and
the simulation wrap it (docs/design.md, "Controller (state machine)").

    config.py    ControllerConfig: heartbeat timeout, unclean election
    state.py     the state (members, master, epochs, SyncStateSet) and its invariants
    messages.py  requests in, decisions out
    elect.py     the election policy (RocketMQ's DefaultElectPolicy)
    machine.py   step(): one request applied
    sync_set.py  the master's side: which SyncStateSet to ask for
    persist.py   the state's versioned JSON form
"""
