"""Controller mode, the broker's side (RocketMQ 5's store/ha/autoswitch): the
epoch file and the truncation of a rejoining replica. A tested library, not
yet wired into the node (docs/design.md, "Controller mode: the broker's epoch
file and rejoin truncation").

    epochs.py      the epoch list and its rules, sans IO: append, becoming
                   master, the last common point with a master's list
    epoch_file.py  its file: the format (count, CRC, entries), written
                   crash-safely through the disk seam, or in place as
                   RocketMQ does (--emulate rmq-epoch-in-place)
    rejoin.py      the rejoin decision, and its crash-safe order on the store
                   and the epoch file
"""
