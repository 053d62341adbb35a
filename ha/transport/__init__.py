"""The HA transport seam (streams.py) and its two twins: gRPC for production
(grpc_transport.py), in memory for tests and the simulation (memory.py,
memory_calls.py; production modules may not import these, by contract)."""
