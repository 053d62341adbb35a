"""Argument types the node, client and cluster commands share."""

from __future__ import annotations

import argparse


def topic_name(text: str) -> str:
    """A topic as every node accepts it (store/names.py: it names a directory)."""
    from store.names import topic_problem

    if problem := topic_problem(text):
        raise argparse.ArgumentTypeError(problem)
    return text


def group_name(text: str) -> str:
    """A consumer group as every node accepts it (store/names.py, RocketMQ's rule)."""
    from store.names import group_problem

    if problem := group_problem(text):
        raise argparse.ArgumentTypeError(problem)
    return text


def address(text: str) -> str:
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise argparse.ArgumentTypeError(f"{text!r}: expected HOST:PORT, e.g. 127.0.0.1:7001")
    return text
