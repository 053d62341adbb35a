"""The CommitLog store every node embeds. The consume side's types are
exported here for the node and the client; everything else is imported from
its module (store.store.MessageStore, store.log.record, ...)."""

from store.consume.consumer_offsets import ConsumerOffsetTable
from store.status import GetMessagesResult, GetMessageStatus, QueuedMessage

__all__ = ["ConsumerOffsetTable", "GetMessageStatus", "GetMessagesResult", "QueuedMessage"]
