"""``llmgw get`` with its stdout a pipe, against a real server, agent and sim models (issue 30, "a CLI that
pipes"): plain aligned columns with whole values, whatever the width; ``--no-headers``, ``--sort-by``,
``--selector``, ``-o name|wide|json|yaml``; ``--watch`` printing a change; a reader that goes (``| head -1``)."""

from __future__ import annotations

import json
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from llmgw.testing.system import System, sim_model

LLMGW = [sys.executable, "-m", "llmgw"]
#: 63 characters, the longest name a model may have: its replicas' ids are longer, its rows far past 80 columns.
LONG = "a-model-whose-name-is-as-long-as-a-model-name-may-be-sixty-3ch"
LONG_LABEL = "x" * 100
BOXES = set("│┃━─┏┓┗┛┡┩└┘├┤╭╮╰╯…")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[System]:
    s = System(tmp_path_factory.mktemp("clipipe"), agent_env={"LLMGW_AGENT_LABELS": f"pool=gpu,rack=r1,"
                                                                                     f"note={LONG_LABEL}"})
    try:
        s.start_server()
        s.start_agent("node1")
        for name, team in (("alpha", "ml"), (LONG, "web")):
            doc = sim_model(name)
            doc["metadata"]["labels"] = {"team": team}
            s.apply(doc)
        for name in ("alpha", LONG):
            s.wait_model(name, timeout=60)
        yield s
    finally:
        s.close()


def llmgw(cluster: System, *args: str) -> subprocess.CompletedProcess[str]:
    """The CLI as a script runs it: stdout and stderr pipes, a narrow COLUMNS that a table must not obey."""
    out = subprocess.run([*LLMGW, *args, "--url", cluster.url], env={**cluster.cli_env(), "COLUMNS": "80"},
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "Traceback" not in out.stderr
    return out


def parse(text: str, headers: list[str]) -> list[dict[str, str]]:
    """The rows of a piped table by the header's column offsets, checking every line keeps them: each cell starts
    at its column's offset, after a blank, and no line is wrapped (every line has a value in the first column)."""
    lines = text.splitlines()
    assert lines[0].split() == " ".join(headers).split(), lines[0]
    starts, at = [], 0
    for h in headers:  # in order, each after the one before ("VERSION" is also inside "ENGINE VERSIONS")
        at = lines[0].index(h, at)
        starts.append(at)
        at += len(h)
    assert starts == sorted(starts) and starts[0] == 0
    assert not set(text) & BOXES and "\x1b" not in text, text
    rows = []
    for line in lines[1:]:
        cells = [line[a:b].strip() for a, b in zip(starts, [*starts[1:], len(line) + 1], strict=True)]
        for start in starts[1:]:
            assert line[start - 1] == " " and line[start] != " ", (line, start)
        assert cells[0] and line[0] != " "
        rows.append(dict(zip(headers, cells, strict=True)))
    return rows


REPLICA_HEADERS = ["REPLICA", "MODEL", "PHASE", "NODE", "SHARD", "ENDPOINT", "MESSAGE"]


def test_get_replicas_piped_is_aligned_columns_with_whole_ids(cluster: System) -> None:
    """Full replica ids and endpoints (none cut to `smollm2-1…`), one line per replica though each is wider
    than the 80 columns COLUMNS says, every column at one offset."""
    api = {r["id"]: r for r in cluster.get("/api/v1/replicas")["items"]}
    out = llmgw(cluster, "get", "replicas").stdout
    rows = parse(out, REPLICA_HEADERS)
    assert {r["REPLICA"]: (r["MODEL"], r["NODE"], r["ENDPOINT"]) for r in rows} == \
        {i: (r["model"], r["node"], r["endpoint"]) for i, r in api.items()}
    assert max(len(line) for line in out.splitlines()) > 80
    assert any(r["REPLICA"].startswith(LONG + "-") for r in rows)


def test_no_headers_sort_by_name_and_wide(cluster: System) -> None:
    """--sort-by a column (MODEL: "a-model…" before "alpha") and by a field (team: "ml" before "web") give the two
    orders; -o name is KIND/NAME a line."""
    rows = llmgw(cluster, "get", "models", "--no-headers", "--sort-by", "MODEL").stdout.splitlines()
    assert [r.split()[0] for r in rows] == [LONG, "alpha"]
    assert rows[1].split()[1:4] == ["sim", "alpha", "1/1"]
    by_team = llmgw(cluster, "get", "models", "--no-headers", "--sort-by", ".metadata.labels.team").stdout
    assert [r.split()[0] for r in by_team.splitlines()] == ["alpha", LONG]
    by_model = llmgw(cluster, "get", "replicas", "--sort-by", "{.model}", "-o", "name").stdout
    ids = sorted((r["model"], r["id"]) for r in cluster.get("/api/v1/replicas")["items"])
    assert by_model.splitlines() == [f"replica/{i}" for _, i in ids]
    assert sorted(llmgw(cluster, "get", "models", "-o", "name").stdout.splitlines()) == [f"model/{LONG}",
                                                                                        "model/alpha"]
    wide = llmgw(cluster, "get", "nodes", "-o", "wide").stdout
    (node,) = parse(wide, ["NODE", "STATUS", "ADDRESS", "POOL", "CPUS", "MEMORY FREE/TOTAL", "GPUS", "GPU UTIL",
                           "ENGINES", "ENGINE VERSIONS", "INSTALLS", "SHARDS", "VERSION", "ENGINE ACCESS",
                           "LABELS"])
    assert node["NODE"] == "node1" and node["STATUS"] == "Ready" and node["ENGINE ACCESS"] == "direct"
    assert node["LABELS"] == f"note={LONG_LABEL},pool=gpu,rack=r1"  # a 100-character value, on its one line
    models_wide = parse(llmgw(cluster, "get", "models", "-o", "wide").stdout,
                        ["MODEL", "ENGINE", "SERVED AS", "READY", "STATE", "SOURCE", "GENERATION", "LABELS",
                         "MESSAGE"])
    assert {m["MODEL"]: m["LABELS"] for m in models_wide} == {"alpha": "team=ml", LONG: "team=web"}


def test_selector_on_models_and_nodes_and_documents(cluster: System) -> None:
    assert llmgw(cluster, "get", "models", "-l", "team=ml", "-o", "name").stdout == "model/alpha\n"
    assert llmgw(cluster, "get", "models", "--selector", "team!=ml", "-o", "name").stdout == f"model/{LONG}\n"
    assert llmgw(cluster, "get", "nodes", "-l", "pool=gpu,rack", "-o", "name").stdout == "node/node1\n"
    none = llmgw(cluster, "get", "nodes", "-l", "pool=cpu")
    assert none.stdout == "" and "no node found matching --selector pool=cpu" in none.stderr
    as_json = json.loads(llmgw(cluster, "get", "models", "-l", "team=web", "-o", "json").stdout)
    assert [m["metadata"] for m in as_json] == [{"name": LONG, "labels": {"team": "web"}}]
    as_yaml = yaml.safe_load(llmgw(cluster, "get", "nodes", "-o", "yaml").stdout)
    assert [n["id"] for n in as_yaml] == ["node1"] and as_yaml[0]["labels"]["pool"] == "gpu"
    refused = subprocess.run([*LLMGW, "get", "replicas", "-l", "a=b", "--url", cluster.url], env=cluster.cli_env(),
                             capture_output=True, text=True, timeout=60)
    assert refused.returncode == 1 and "replica objects have no labels" in refused.stderr


class Lines:
    """A process's stdout read line by line in a thread, so a test waits for a line with a deadline."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        assert proc.stdout is not None
        self.queue: queue.Queue[str | None] = queue.Queue()
        stream = proc.stdout
        threading.Thread(target=lambda: [*map(self.queue.put, stream), self.queue.put(None)], daemon=True).start()

    def until(self, want: str, timeout: float) -> list[str]:
        """Lines until one starting with ``want``; AssertionError naming what came if none does in time."""
        lines: list[str] = []
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            try:
                line = self.queue.get(timeout=left)
            except queue.Empty:
                break
            if line is None:
                break
            lines.append(line.rstrip("\n"))
            if line.startswith(want):
                return lines
        raise AssertionError(f"no line starting {want!r} within {timeout}s; read {lines}")


def test_watch_prints_a_model_applied_meanwhile_then_ends_on_sigint(cluster: System) -> None:
    # Ctrl-C as on a terminal: SIGINT's default disposition in the child. A test run in the background (`make
    # test-e2e &`, nohup) inherits SIGINT ignored, and Python then installs no KeyboardInterrupt for it.
    proc = subprocess.Popen([*LLMGW, "get", "models", "--watch", "--url", cluster.url], env=cluster.cli_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, bufsize=1,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        lines = Lines(proc)
        first = lines.until("alpha", timeout=30)
        assert first[0].split()[0] == "MODEL" and [ln.split()[0] for ln in first[1:]] == [LONG, "alpha"]
        cluster.apply(sim_model("gamma"))
        later = lines.until("gamma", timeout=30)
        assert later[-1].index("sim") == first[0].index("ENGINE")  # under the first listing's columns
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=15) == 0
        assert proc.stderr is not None and "Traceback" not in proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        cluster.request("DELETE", "/api/v1/models/gamma")


def test_a_reader_that_goes_ends_the_command_quietly(cluster: System, tmp_path: Path) -> None:
    """`llmgw get models | head -1` and `llmgw get models -w | head -1`: head takes its line and exits; the
    watch's next write finds the pipe closed and ends it, exit 0, nothing on stderr."""
    for args in (["get", "models"], ["get", "models", "-w"]):
        err = tmp_path / f"err-{len(args)}.txt"
        with err.open("w") as errf:
            cli = subprocess.Popen([*LLMGW, *args, "--url", cluster.url], env=cluster.cli_env(),
                                   stdout=subprocess.PIPE, stderr=errf)
            assert cli.stdout is not None
            head = subprocess.run(["head", "-1"], stdin=cli.stdout, capture_output=True, timeout=30)
            cli.stdout.close()  # only head holds the read end, and head has gone
            try:
                if "-w" in args:
                    cluster.apply(sim_model("delta"))  # a change to print, into the closed pipe
                code = cli.wait(timeout=30)
            finally:
                if cli.poll() is None:
                    cli.kill()
                    cli.wait()
        assert head.stdout.decode().split()[0] == "MODEL"
        said = err.read_text()
        assert code == 0 and "Traceback" not in said and "Exception ignored" not in said, (code, said)
    cluster.request("DELETE", "/api/v1/models/delta")
