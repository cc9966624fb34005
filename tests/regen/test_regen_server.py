"""``hsextract regenerate`` against the real SGLang server on CPU.

Two servers: the suite's shared tiny random Llama (replies that depend on the history), and a
scripted tiny Llama with a Qwen3-style template and SGLang's ``qwen3`` reasoning parser and
``qwen25`` tool-call parser, whose reply is always the same: it thinks, then calls ``get_weather``
(tests/support/scripted_model.py). The scripted one runs without the capture and with the radix
cache, as a generation server does; the shared one is in the capture profile, which serves the
regenerator's requests as the generation profile does: the capture leaves no dump of a request it
does not own (test_regeneration_through_a_capturing_server_leaves_no_dump) and the radix cache only
changes how fast a shared prefix is computed. One server start fewer (about 35 CPU-seconds).
A recording proxy in front of a server shows the requests the regenerator actually sent.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
import requests
from hsextract.cli import main
from support.recording_proxy import RecordingProxy
from support.scripted_model import REASONING, WEATHER_TOOL, make_scripted_model
from support.sglang_server import start_server

pytestmark = pytest.mark.server

REPO = Path(__file__).resolve().parents[2]
TEMPLATES = REPO / "tests" / "dataset" / "templates"
WORDS = [
    "the",
    "capital",
    "city",
    "of",
    "france",
    "is",
    "paris",
    "hello",
    "world",
    "quick",
    "brown",
    "fox",
    "jumps",
    "over",
    "lazy",
    "dog",
]


@pytest.fixture
def regen_server(llama_server):
    """The server the regenerator talks to: the suite's shared tiny Llama (the module docstring says why)."""
    return llama_server


@pytest.fixture(scope="module")
def scripted_server(request, tmp_path_factory, tiny_llama, free_port):
    base = tmp_path_factory.mktemp("scripted-server")
    model = make_scripted_model(tiny_llama, base / "model", (TEMPLATES / "qwen3_tools.jinja").read_text())
    handle = start_server(
        model,
        port=free_port(),
        dump_dir=base / "dump",
        log_dir=base / "logs",
        capture=False,
        radix_cache=True,
        extra_args=["--reasoning-parser", "qwen3", "--tool-call-parser", "qwen25"],
    )
    request.addfinalizer(handle.stop_later)
    return handle


@pytest.fixture
def proxy(free_port):
    def start(server):
        p = RecordingProxy(server.url, free_port()).start()
        started.append(p)
        return p

    started: list[RecordingProxy] = []
    yield start
    for p in started:
        p.stop()


def _sentence(rng) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 8))).capitalize() + "."


def write_conversations(path: Path, n: int, seed: int = 0, turns: int = 2) -> list[dict]:
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        msgs = []
        for _ in range(1 + i % turns):
            msgs += [
                {"role": "user", "content": _sentence(rng)},
                {"role": "assistant", "content": "SOURCE " + _sentence(rng)},
            ]
        rows.append({"id": f"c{i}", "messages": msgs})
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return rows


def regenerate(server_url: str, dataset: Path, out: Path, *extra: str) -> int:
    return main(["regenerate", "--server", server_url, "--dataset", str(dataset), "--output", str(out), *extra])


def output_rows(out: Path) -> list[dict]:
    path = out / "conversations.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def error_rows(out: Path) -> list[dict]:
    path = out / ".hsextract" / "regen-errors.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _history(messages: list[dict]) -> list[dict]:
    """What --reasoning strip-history sends of the turns before a reply (the stored fields, less reasoning)."""
    return [{k: v for k, v in m.items() if k not in ("reasoning_content", "truncated")} for m in messages]


# -- replies, history, conditioning -----------------------------------------------------------------


def test_each_reply_is_what_chat_completions_answers_for_its_regenerated_history(regen_server, proxy, tmp_path):
    # one conversation at a time: on CPU a batch of other size may round a logit the other way
    rows = write_conversations(tmp_path / "d.jsonl", 8, seed=1, turns=3)
    p = proxy(regen_server)
    assert (
        regenerate(p.url, tmp_path / "d.jsonl", tmp_path / "out", "--max-new-tokens", "12", "--concurrency", "1") == 0
    )
    out = {r["id"]: r for r in output_rows(tmp_path / "out")}
    failed = error_rows(tmp_path / "out")
    assert {e["reason"] for e in failed} <= {"empty_reply"}, "the random model's blank replies are the only cuts"
    assert sorted(out) + sorted(e["key"][3:] for e in failed) == sorted(r["id"] for r in rows)
    sent = [body["messages"] for body in p.requests()]
    model = p.requests()[0]["model"]
    for row in rows:
        if row["id"] not in out:
            continue
        got = out[row["id"]]["messages"]
        cut = out[row["id"]]["regenerated"]["cut"]
        assert [m["role"] for m in got] == [m["role"] for m in row["messages"]][: len(got)]
        assert len(got) == len(row["messages"]) or cut["reason"] == "empty_reply"
        assert [m["content"] for m in got if m["role"] == "user"] == [
            m["content"] for m in row["messages"][: len(got)] if m["role"] == "user"
        ]
        for k, m in enumerate(got):
            if m["role"] != "assistant":
                continue
            assert not m["content"].startswith("SOURCE"), "every reply is the model's"
            history = _history(got[:k])
            assert history in sent, "the request for this turn carried the regenerated history"
            direct = requests.post(
                f"{regen_server.url}/v1/chat/completions",
                timeout=120,
                json={"model": model, "messages": history, "temperature": 0, "max_tokens": 12},
            ).json()
            assert direct["choices"][0]["message"]["content"] == m["content"]
            assert m.get("truncated", False) == (direct["choices"][0]["finish_reason"] == "length")
    assert len({json.dumps(h) for h in sent}) == len(sent), "one request per turn, none twice"


def test_turn_two_is_sent_with_turn_ones_regenerated_reply_not_the_sources(regen_server, proxy, tmp_path):
    rows = write_conversations(tmp_path / "d.jsonl", 2, seed=2, turns=2)  # row 1 has two turns
    p = proxy(regen_server)
    assert regenerate(p.url, tmp_path / "d.jsonl", tmp_path / "out", "--max-new-tokens", "8") == 0
    two_turns = rows[1]["messages"]
    turn2 = [b["messages"] for b in p.requests() if len(b["messages"]) == 3]
    assert len(turn2) == 1, "exactly one request for the second turn"
    reply1 = next(r for r in output_rows(tmp_path / "out") if r["id"] == "c1")["messages"][1]
    assert turn2[0][0]["content"] == two_turns[0]["content"] and turn2[0][2]["content"] == two_turns[2]["content"]
    assert turn2[0][1]["content"] == reply1["content"] != two_turns[1]["content"]


def test_last_turn_only_regenerates_one_turn_on_the_source_history(regen_server, proxy, tmp_path):
    rows = write_conversations(tmp_path / "d.jsonl", 3, seed=3, turns=3)
    p = proxy(regen_server)
    assert regenerate(p.url, tmp_path / "d.jsonl", tmp_path / "out", "--max-new-tokens", "8", "--last-turn-only") == 0
    assert len(p.requests()) == 3
    for r in output_rows(tmp_path / "out"):
        src = next(x for x in rows if x["id"] == r["id"])["messages"]
        assert [m["content"] for m in r["messages"][:-1]] == [m["content"] for m in src[:-1]]
        assert r["regenerated"]["turns"] == 1


# -- reasoning --------------------------------------------------------------------------------------


def _two_turns(path: Path) -> None:
    path.write_text(
        json.dumps(
            {
                "id": "r",
                "messages": [
                    {"role": "user", "content": "Weather?"},
                    {"role": "assistant", "content": "SOURCE one"},
                    {"role": "user", "content": "And tomorrow?"},
                    {"role": "assistant", "content": "SOURCE two"},
                ],
            }
        )
        + "\n"
    )


@pytest.mark.parametrize("mode", ["keep", "strip-history", "disable"])
def test_reasoning_mode_decides_the_history_of_the_next_turn(scripted_server, proxy, tmp_path, mode):
    _two_turns(tmp_path / "d.jsonl")
    p = proxy(scripted_server)
    assert regenerate(p.url, tmp_path / "d.jsonl", tmp_path / "out", "--reasoning", mode) == 0
    first, second = p.requests()
    replies = [m for m in output_rows(tmp_path / "out")[0]["messages"] if m["role"] == "assistant"]
    earlier = second["messages"][1]
    if mode == "disable":
        assert first["chat_template_kwargs"] == second["chat_template_kwargs"] == {"enable_thinking": False}
        assert all("reasoning_content" not in m for m in replies), "no thinking when it is switched off"
        assert "reasoning_content" not in earlier
    else:
        assert "chat_template_kwargs" not in first
        assert [m["reasoning_content"].strip() for m in replies] == [REASONING, REASONING], "stored per turn"
        if mode == "keep":
            assert earlier["reasoning_content"].strip() == REASONING
        else:
            assert "reasoning_content" not in earlier and "<think>" not in earlier["content"]
    assert earlier["content"] == replies[0]["content"]


# -- tools ------------------------------------------------------------------------------------------


def test_tool_results_are_spliced_when_the_model_calls_the_same_tool_and_cut_when_not(scripted_server, proxy, tmp_path):
    def call(name, cid):
        return {"id": cid, "type": "function", "function": {"name": name, "arguments": '{"city": "Paris"}'}}

    rows = [
        {
            "id": "same",
            "tools": [WEATHER_TOOL],
            "messages": [
                {"role": "user", "content": "Weather in Paris?"},
                {"role": "assistant", "content": "", "tool_calls": [call("get_weather", "src1")]},
                {"role": "tool", "content": "sunny", "tool_call_id": "src1"},
                {"role": "assistant", "content": "It is sunny."},
            ],
        },
        {
            "id": "other",
            "tools": [WEATHER_TOOL],
            "messages": [
                {"role": "user", "content": "Time in Paris?"},
                {"role": "assistant", "content": "", "tool_calls": [call("get_time", "src1")]},
                {"role": "tool", "content": "noon", "tool_call_id": "src1"},
                {"role": "assistant", "content": "It is noon."},
            ],
        },
    ]
    (tmp_path / "d.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    p = proxy(scripted_server)
    assert regenerate(p.url, tmp_path / "d.jsonl", tmp_path / "out") == 0
    (same,) = output_rows(tmp_path / "out")
    new_call = same["messages"][1]["tool_calls"][0]
    assert new_call["function"]["name"] == "get_weather" and new_call["id"] != "src1"
    # the second turn's request: the source's result answers the regenerated call
    turn2 = next(
        b for b in p.requests() if len(b["messages"]) == 3 and b["messages"][0]["content"].startswith("Weather")
    )
    assert turn2["messages"][2] == {"role": "tool", "content": "sunny", "tool_call_id": new_call["id"]}
    assert turn2["tools"] == [WEATHER_TOOL]
    # ...whose reply calls the tool again where the source answered: cut before it, with the reason
    assert same["regenerated"]["cut"]["reason"] == "tool_calls_differ" and same["regenerated"]["cut"]["turn"] == 3
    (other,) = error_rows(tmp_path / "out")
    assert other["key"] == "id:other" and other["reason"] == "tool_calls_differ"
    assert "get_time" in other["detail"] and "get_weather" in other["detail"]


# -- bad input, the capture, extraction of the result ------------------------------------------------


def test_bad_input_gets_a_reason_in_the_errors_file_and_the_rest_is_done(regen_server, tmp_path):
    long_text = " ".join(["paris"] * 2100)  # longer than the model's 2048-token context
    lines = [
        json.dumps({"id": "ok", "messages": [{"role": "user", "content": "Hello world."}]}),
        '{"messages": [{"role": "user"',
        json.dumps(
            {
                "id": "nouser",
                "messages": [{"role": "system", "content": "Be brief."}, {"role": "assistant", "content": "Hi."}],
            }
        ),
        json.dumps({"id": "huge", "messages": [{"role": "user", "content": long_text}]}),
        json.dumps(
            {
                "id": "badargs",
                "messages": [  # the server refuses tool call arguments that are not JSON
                    {"role": "user", "content": "Weather?"},
                    {
                        "role": "assistant",
                        "content": "",
                        "tool_calls": [
                            {
                                "id": "x",
                                "type": "function",
                                "function": {"name": "get_weather", "arguments": "{not json"},
                            }
                        ],
                    },
                    {"role": "tool", "content": "sunny", "tool_call_id": "x"},
                    {"role": "assistant", "content": "Sunny."},
                ],
            }
        ),
        json.dumps({"input_ids": [1, 2, 3]}),
    ]
    (tmp_path / "d.jsonl").write_text("\n".join(lines) + "\n")
    assert (
        regenerate(
            regen_server.url,
            tmp_path / "d.jsonl",
            tmp_path / "out",
            "--max-new-tokens",
            "8",
            "--last-turn-only",
            "--max-attempts",
            "2",
        )
        == 0
    )
    assert [r["id"] for r in output_rows(tmp_path / "out")] == ["ok"]
    reasons = {e["line"]: e["reason"] for e in error_rows(tmp_path / "out")}
    assert reasons == {
        2: "malformed_json",
        3: "no_user_turn",
        4: "context_full",
        5: "server_rejected",
        6: "pre_tokenized",
    }
    assert all(e["detail"] for e in error_rows(tmp_path / "out"))
    summary = json.loads((tmp_path / "out" / ".hsextract" / "regen-summary.json").read_text())
    assert summary["ok"] == 1 and sum(summary["failed"].values()) == 5 and summary["state"] == "done"
    # a second run finds everything done and writes nothing
    assert (
        regenerate(
            regen_server.url,
            tmp_path / "d.jsonl",
            tmp_path / "out",
            "--max-new-tokens",
            "8",
            "--last-turn-only",
            "--max-attempts",
            "2",
        )
        == 0
    )
    assert len(output_rows(tmp_path / "out")) == 1 and len(error_rows(tmp_path / "out")) == 5
    again = json.loads((tmp_path / "out" / ".hsextract" / "regen-summary.json").read_text())
    assert (again["ok"], again["failed"]) == (summary["ok"], summary["failed"]), "the whole regeneration's counts"
    assert again["this_run"]["skipped"] == 6 and again["this_run"]["ok"] == 0


def test_regeneration_through_a_capturing_server_leaves_no_dump(llama_server, tmp_path):
    write_conversations(tmp_path / "d.jsonl", 4, seed=4)
    before = sorted(p.name for p in llama_server.dump_dir.iterdir())
    assert regenerate(llama_server.url, tmp_path / "d.jsonl", tmp_path / "out", "--max-new-tokens", "4") == 0
    assert len(output_rows(tmp_path / "out")) + len(error_rows(tmp_path / "out")) == 4
    assert sorted(p.name for p in llama_server.dump_dir.iterdir()) == before
    records = llama_server.dump_dir / "_records"
    assert not records.exists() or not any(p.name[:3] != "hsx" for p in records.iterdir())


def test_regenerated_dataset_is_extracted_unchanged(regen_server, llama_server, tiny_llama, tmp_path):
    import torch
    from hsextract.dataset.chat_template import load_tokenizer, tokenize_with_mask
    from hsextract.dataset.reader import read_dataset
    from hsextract.output.manifest import iter_entries

    write_conversations(tmp_path / "d.jsonl", 6, seed=5)
    assert regenerate(regen_server.url, tmp_path / "d.jsonl", tmp_path / "regen", "--max-new-tokens", "8") == 0
    out = tmp_path / "train"
    args = [
        "--dump-dir",
        str(llama_server.dump_dir),
        "--output",
        str(out),
        "--model",
        str(tiny_llama),
        "--format",
        "specforge",
    ]
    assert main(["extract", "--server", llama_server.url, "--dataset", str(tmp_path / "regen"), *args]) == 0
    assert main(["drain", *args, "--exit-when-done", "--poll-interval", "0.2", "--finalize-idle", "3600"]) == 0
    tok = load_tokenizer(tiny_llama)
    regenerated = read_dataset(tmp_path / "regen" / "conversations.jsonl")
    want = {s.index: tokenize_with_mask(tok, s.messages) for s in regenerated}
    got = {e.dataset_index: torch.load(out / e.file, weights_only=True) for e in iter_entries(out)}
    assert sorted(got) == sorted(want) == list(range(len(output_rows(tmp_path / "regen"))))
    assert len(want) + len(error_rows(tmp_path / "regen")) == 6
    for i, (ids, mask) in want.items():
        assert got[i]["input_ids"].tolist() == ids and got[i]["loss_mask"].tolist() == mask


# -- kill -9 ----------------------------------------------------------------------------------------


def _lines(path: Path) -> int:
    try:
        return path.read_bytes().count(b"\n")
    except FileNotFoundError:
        return 0


def _wait_for(predicate, timeout: float, what: str, log: Path) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}:\n{log.read_text()[-3000:]}")


def test_killed_five_times_every_conversation_is_done_exactly_once(regen_server, tmp_path):
    rows = write_conversations(tmp_path / "d.jsonl", 100, seed=6, turns=3)
    out, log = tmp_path / "out", tmp_path / "regen.log"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO / "files" / "python"), os.environ.get("PYTHONPATH", "")]),
    }
    cmd = [
        sys.executable,
        "-m",
        "hsextract",
        "regenerate",
        "--server",
        regen_server.url,
        "--dataset",
        str(tmp_path / "d.jsonl"),
        "--output",
        str(out),
        "--max-new-tokens",
        "6",
        "--concurrency",
        "4",
        "--log-every",
        "1",
    ]
    data = out / "conversations.jsonl"
    proc = None
    try:
        for at in (8, 24, 40, 56, 72):
            with log.open("ab") as fh:
                proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, env=env, start_new_session=True)
            _wait_for(lambda n=at, p=proc: _lines(data) >= n or p.poll() is not None, 300, f"{at} conversations", log)
            assert proc.poll() is None, f"the run ended before {at} conversations were written"
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)
        with log.open("ab") as fh:
            assert subprocess.run(cmd, stdout=fh, stderr=subprocess.STDOUT, env=env, timeout=600).returncode == 0
    finally:
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
    keys = [r["key"] for r in output_rows(out)] + [e["key"] for e in error_rows(out)]
    assert sorted(keys) == sorted(f"id:{r['id']}" for r in rows), "every conversation exactly once"
    # the random model answers a few prompts with blanks only: those are cut, with their reason
    assert {e["reason"] for e in error_rows(out)} <= {"empty_reply"}
    summary = json.loads((out / ".hsextract" / "regen-summary.json").read_text())
    assert summary["state"] == "done" and summary["this_run"]["skipped"] >= 72
    assert summary["ok"] == len(output_rows(out)) and sum(summary["failed"].values()) == len(error_rows(out))
    assert summary["ok"] + sum(summary["failed"].values()) == 100
    status = json.loads((out / ".hsextract" / "regen-status.json").read_text())
    assert status["state"] == "done" and status["done"] == 100


def test_the_summary_of_a_resumed_regeneration_counts_what_every_run_wrote(regen_server, tmp_path):
    """The summary is of the whole regeneration: the rows the first run rejected and the
    conversations it wrote count, as the errors file and the output list them."""
    data, out, log = tmp_path / "d.jsonl", tmp_path / "out", tmp_path / "regen.log"
    write_conversations(data, 12, seed=8)
    data.write_text("{broken\n[1]\n" + data.read_text())  # two rows the first run rejects at once
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO / "files" / "python"), os.environ.get("PYTHONPATH", "")]),
    }
    with log.open("ab") as fh:
        first = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "hsextract",
                "regenerate",
                "--server",
                regen_server.url,
                "--dataset",
                str(data),
                "--output",
                str(out),
                "--max-new-tokens",
                "6",
                "--concurrency",
                "1",
            ],
            stdout=fh,
            stderr=subprocess.STDOUT,
            env=env,
        )
    try:
        _wait_for(
            lambda: _lines(out / "conversations.jsonl") >= 3 or first.poll() is not None, 300, "3 conversations", log
        )
        assert first.poll() is None, "the first run ended before it could be stopped"
        first.send_signal(signal.SIGTERM)
        assert first.wait(120) == 0
    finally:
        if first.poll() is None:
            first.kill()
    assert not (out / ".hsextract" / "regen-summary.json").exists(), "a stopped run writes no summary"
    assert regenerate(regen_server.url, data, out, "--max-new-tokens", "6") == 0
    summary = json.loads((out / ".hsextract" / "regen-summary.json").read_text())
    errors = Counter(e["reason"] for e in error_rows(out))
    assert errors["malformed_json"] == 1 and errors["not_an_object"] == 1
    assert summary["failed"] == dict(errors) and summary["ok"] == len(output_rows(out))
    assert summary["ok"] + sum(summary["failed"].values()) == summary["conversations_total"] == 14
    assert summary["turns"] == sum(r["regenerated"]["turns"] for r in output_rows(out))
    assert summary["this_run"]["skipped"] >= 5 and summary["this_run"]["ok"] < summary["ok"]


def test_conversations_of_a_server_that_goes_away_are_done_by_the_others(regen_server, proxy, free_port, tmp_path):
    import threading

    rows = write_conversations(tmp_path / "d.jsonl", 40, seed=7, turns=3)
    a, b = proxy(regen_server), proxy(regen_server)
    never_up = f"http://127.0.0.1:{free_port()}"
    out = tmp_path / "out"
    codes: list[int] = []
    run = threading.Thread(
        target=lambda: codes.append(
            regenerate(
                a.url,
                tmp_path / "d.jsonl",
                out,
                "--server",
                b.url,
                "--server",
                never_up,
                "--server-wait",
                "3",
                "--concurrency",
                "2",
                "--max-new-tokens",
                "6",
            )
        )
    )
    run.start()
    try:
        _wait_for(lambda: len(output_rows(out)) >= 5 and a.requests(), 300, "five conversations", tmp_path / "d.jsonl")
        a.stop()  # the server behind it is fine; for the run, this one is gone
        at_stop = len(b.requests())
    finally:
        run.join(600)
    assert codes == [0]
    keys = [r["key"] for r in output_rows(out)] + [e["key"] for e in error_rows(out)]
    assert sorted(keys) == sorted(f"id:{r['id']}" for r in rows), "every conversation exactly once"
    assert len(b.requests()) > at_stop, "the remaining server took over"
    servers = json.loads((out / ".hsextract" / "regen-status.json").read_text())["servers"]
    assert servers[a.url]["state"] == "gone" and servers[b.url]["state"] == "up" and never_up not in servers
