"""Talking to nodes over gRPC: the node client (node_client.py: sends, reads,
status; blocking and asyncio flavours), the pull consumer with RocketMQ's two
offset stores (consumer.py) and the load loop behind `dlab send`
(sendload.py).

It may import cluster/node/ (the wire format and the token file), never
cluster/backends/ (a client finds a cluster from its directory's
cluster.json, not through a backend), bench/ or cli/."""
