"""The node process: the gRPC server around one store and its HA master or
slave (server.py, `dlab node`), the broker's send stream (send_stream.py) and
consume side (consume_service.py), request guards, the protobuf conversions
shared with the client (wire.py), the cluster token (auth.py: made, stored,
sent and checked) and a node's Role (role.py).

The bottom of the cluster layer: it imports store/, ha/ and proto/, and
nothing else of cluster/ (client/, backends/ and cli/ import it)."""
