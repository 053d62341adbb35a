"""`dlab controller`: the controller of controller mode as a process.

The decisions are ha/controller/ (a pure state machine); this package is
what runs them for real: the clock, the durable state file, gRPC.

    state_file.py  the state on disk: lock, load, write-fsync-rename-fsync
    core.py        the state machine on a clock and a state file (no gRPC)
    servicer.py    the Controller gRPC service: convert, call, answer
    server.py      the process: gRPC server, liveness scan, signals
    client.py      a token-carrying client (`dlab controller status`, tests)
"""
