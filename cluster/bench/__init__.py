"""The replication benchmarks (replication.py): a slave's catch-up of a
backlog and SYNC_MASTER throughput and latency, each against baselines
measured in the same run. They drive real node processes through the local
backend and the client, and stores in-process.

It may import cluster/backends/, cluster/client/ and cluster/node/; its
command line (`dlab bench catch-up|sync-master`) is cluster/cli/bench.py."""
