"""The chaos run's consumer: `dlab consume --jsonl` as its own OS process,
so a scenario can SIGKILL it like a node, and restart it (a new
incarnation, with the offsets the broker kept for its group).

Each incarnation writes its deliveries to RUN_DIR/consumer/N.jsonl as they
happen (flushed per line, before the offset moves), so a kill loses no
observation; `rows()` merges them for the run's consumed.jsonl.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from typing import Any

from chaos.workload import TOPIC

GROUP = "chaos"
# RocketMQ's persistConsumerOffsetInterval: a consumer killed inside it
# receives again what it consumed since its last commit.
COMMIT_INTERVAL_MS = 5_000


class ConsumerProcess:
    def __init__(self, run_dir: str, *, targets: list[str], token_file: str,
                 commit_interval_ms: int = COMMIT_INTERVAL_MS) -> None:
        self.dir = os.path.join(run_dir, "consumer")
        self.targets = targets
        self.token_file = token_file
        self.commit_interval_ms = commit_interval_ms
        self.incarnations = 0
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def start(self) -> None:
        assert not self.running
        os.makedirs(self.dir, exist_ok=True)
        self.incarnations += 1
        args = [sys.executable, "-m", "cluster.cli", "consume", "--group", GROUP,
                "--topic", TOPIC, "--token-file", self.token_file, "--jsonl",
                "--idle-exit", "3600", "--commit-interval-ms", str(self.commit_interval_ms)]
        for t in self.targets:
            args += ["--from", t]
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        base = os.path.join(self.dir, str(self.incarnations))
        # The child holds the files; the parent's copies close at once.
        with open(base + ".jsonl", "wb") as out, open(base + ".log", "wb") as err:
            self._proc = subprocess.Popen(args, stdout=out, stderr=err, env=env)

    def kill(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait(timeout=10)

    def drain(self, *, quiet_s: float = 2.0, timeout_s: float = 20.0) -> None:
        """Let the consumer catch up: wait until its output has not grown
        for `quiet_s` (bounded by `timeout_s`), then stop it."""
        if not self.running:
            return
        path = os.path.join(self.dir, f"{self.incarnations}.jsonl")
        deadline = time.monotonic() + timeout_s
        last, since = -1, time.monotonic()
        while time.monotonic() < deadline and self.running:
            size = os.path.getsize(path)
            if size != last:
                last, since = size, time.monotonic()
            elif time.monotonic() - since >= quiet_s:
                break
            time.sleep(0.1)
        self.kill()

    def rows(self) -> list[dict[str, Any]]:
        """Every delivery of every incarnation, in order, tagged with it."""
        out: list[dict[str, Any]] = []
        for n in range(1, self.incarnations + 1):
            path = os.path.join(self.dir, f"{n}.jsonl")
            if not os.path.exists(path):
                continue
            with open(path, encoding="utf-8") as f:
                for line in f:
                    line = line.strip()
                    if not line:
                        continue
                    try:
                        row = json.loads(line)
                    except json.JSONDecodeError:
                        continue  # a line cut by the kill: never handed over whole
                    row["incarnation"] = n
                    out.append(row)
        return out
