"""Names that become file paths: topics and queue ids (and, reusing the
same rule, the names peers give themselves and consumer groups).

A topic names a directory (`consumequeue/<topic>/<queue id>/`), so it is
checked on every way in — a put, a pull or offset commit, a directory found
on disk, a record replayed from the CommitLog — as RocketMQ's
TopicValidator checks it: `^[%|a-zA-Z0-9_-]+$`, at most 127 characters.
Nothing the pattern allows can climb out of a directory ('.' and '/' are not
in it) or hold a NUL.

A queue id names a directory too: 0 up to MAX_QUEUE_ID. RocketMQ checks it
against the topic's writeQueueNums; this lab has no topic table, so the
bound is one number, large enough for any test and small enough that a
stray id cannot make millions of directories.

A consumer group names an entry of the offset table, shipped to slaves and
shown by `cluster status`: RocketMQ checks it with the topic's characters
and at most 255 characters (Validators.checkGroup, CHARACTER_MAX_LENGTH), so
no group carries '@' (the table's `topic@group` separator), a control
character or a megabyte into a slave's sync.

Pure: strings in, a problem (a sentence naming the rule) or None out.
"""

from __future__ import annotations

import re
from functools import lru_cache

TOPIC_MAX_LENGTH = 127  # RocketMQ's TopicValidator.TOPIC_MAX_LENGTH
TOPIC_RULE = "letters, digits, '%', '|', '_' and '-' only (^[%|a-zA-Z0-9_-]+$)"
_NAME = re.compile(r"[%|a-zA-Z0-9_-]+")
MAX_QUEUE_ID = 1023
GROUP_MAX_LENGTH = 255  # RocketMQ's Validators.CHARACTER_MAX_LENGTH


def name_problem(kind: str, name: str, max_length: int) -> str | None:
    """What is wrong with `name` as a `kind` (a topic, a slave name), or
    None. The answer always states the whole rule."""
    if not name:
        what = f"{kind} is empty"
    elif len(name) > max_length:
        what = f"{kind} {name[:40]!r}... is {len(name)} characters long"
    elif not _NAME.fullmatch(name):
        what = f"{kind} {name[:80]!r} is not allowed"
    else:
        return None
    return f"{what}: a {kind} is 1..{max_length} characters, {TOPIC_RULE}"


def topic_problem(topic: str) -> str | None:
    """What is wrong with `topic`, or None."""
    if len(topic) > TOPIC_MAX_LENGTH:  # not cached: the cache holds short strings only
        return name_problem("topic", topic, TOPIC_MAX_LENGTH)
    return _short_topic_problem(topic)


@lru_cache(maxsize=1024)
def _short_topic_problem(topic: str) -> str | None:
    # Cached: the put path asks about the same few topics again and again.
    return name_problem("topic", topic, TOPIC_MAX_LENGTH)


def group_problem(group: str) -> str | None:
    """What is wrong with `group` as a consumer group, or None."""
    return name_problem("consumer group", group, GROUP_MAX_LENGTH)


def queue_id_problem(queue_id: int) -> str | None:
    if not 0 <= queue_id <= MAX_QUEUE_ID:
        return f"queue id {queue_id} is out of range: queues are numbered 0..{MAX_QUEUE_ID}"
    return None

