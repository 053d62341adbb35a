"""Controller mode, the broker's side (RocketMQ 5's store/ha/autoswitch): the
epoch file and the truncation of a rejoining replica (docs/design.md,
"Controller mode: the broker's epoch file and rejoin truncation"). A
controller-mode node (cluster/node/server.py) keeps the file in its store's
root and runs the truncation when it follows a master.

    epochs.py      the epoch list and its rules, sans IO: append, becoming
                   master, the last common point with a master's list
    epoch_file.py  its file: the format (count, CRC, entries), written
                   crash-safely through the disk seam, or in place as
                   RocketMQ does (--emulate rmq-epoch-in-place)
    rejoin.py      the rejoin decision, and its crash-safe order on the store
                   and the epoch file
"""
