"""The cluster layer: nodes that serve a store over gRPC and replicate it
(ha/), the clients that talk to them, the backends that run them, and the
command line of all that.

Subpackages, top to bottom; each imports only those below it (the layers
contract in pyproject.toml, checked by `lint-imports`):

- cli/       `python -m cluster.cli`: the parser, error handling and every
             command of this layer and below (`dlab` adds chaos's on top);
- bench/     the replication benchmarks (`dlab bench catch-up|sync-master`);
- backends/  run a cluster of node processes (local processes or compose)
  client/    and talk to its nodes (client, consumer, load loop): neither
             imports the other;
- node/      the node process itself: server, servicers, wire format, token.
"""
