"""Running a cluster: the backend interface and specs every backend
implements (interface.py), the local backend (local.py: node processes on
this host, procs.py, and a cuttable TCP proxy per replication link,
proxy.py), the compose backend (compose.py) with the node image it runs
(image.py) and the one way to reach a Docker engine (docker_engine.py), the
cluster directory both keep (state_dir.py), and the backends by name
(registry.py).

A backend starts nodes as processes (`python -m cluster.cli node`, or `dlab
node` in a container), so it imports from cluster/node/ only the token file
helpers and the Role; never cluster/client/, bench/ or cli/."""
