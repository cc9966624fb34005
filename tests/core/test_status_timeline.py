"""``hsextract status`` shows when the drain committed the run's samples against the client's end:
the commits after it, how long after it the last one came (a tail), and the self-check's queue."""

from __future__ import annotations

import json
from pathlib import Path

from hsextract.cli import main
from hsextract.output.manifest import ManifestAppender, ManifestEntry

END = 1_700_000_000.0  # the client's end
QUEUE = {"waiting": 0, "running": 0, "done": 4, "passes": 3, "skipped_for_load": 1}


def _run(out: Path, commits: list[tuple[float, int]]) -> None:
    """A finished run whose drain committed `commits` ((time, samples) each) and self-checked 4 samples."""
    out.mkdir(parents=True)
    (out / "run.json").write_text(json.dumps({"run_id": "r1"}))
    state = out / ".hsextract"
    state.mkdir()
    lines = sum(n for _, n in commits)
    summary = {"state": "done", "dataset_lines": lines, "shard": [0, 1], "ok": lines, "finished_at": END}
    (state / "client-summary.json").write_text(json.dumps(summary))
    selfcheck = {"checked": 4, "seen": lines, "queue": QUEUE}
    drain = {"state": "done", "samples_total": lines, "lag": 0, "in_flight": 0, "selfcheck": selfcheck}
    (state / "drain-status.json").write_text(json.dumps({**drain, "updated_at": END + 30}))
    app = ManifestAppender(out)
    index = 0
    for at, n in commits:
        app.append(
            [
                ManifestEntry(index + k, index + k, f"hsx-r1-{index + k}", 10, f"f{index + k}", 1, "x:0", at)
                for k in range(n)
            ]
        )
        index += n
    app.close()


def _status(out: Path, capsys, *flags: str) -> str:
    capsys.readouterr()
    main(["status", "--output", str(out), *flags])
    return capsys.readouterr().out


def test_status_json_gives_the_commits_after_the_clients_end_and_the_selfchecks_queue(tmp_path, capsys):
    out = tmp_path / "out"
    _run(out, [(END - 9.0, 3), (END - 4.0, 1), (END + 0.5, 1), (END + 3.25, 2)])
    commits = json.loads(_status(out, capsys, "--json"))["commits"]
    assert commits == {
        "samples": 7,
        "commits": 4,
        "first_at": END - 9.0,
        "last_at": END + 3.25,
        "client_end_at": END,
        "after_client_end": {"samples": 3, "commits": 2, "last_s": 3.25},
        "tail": True,
        "selfcheck_queue": QUEUE,
    }


def test_the_status_says_a_tail_when_the_last_commit_came_seconds_after_the_clients_end(tmp_path, capsys):
    tail, level = tmp_path / "tail", tmp_path / "level"
    _run(tail, [(END - 9.0, 3), (END + 0.5, 1), (END + 3.25, 2)])
    _run(level, [(END - 9.0, 3), (END + 0.05, 1)])
    lines = _status(tail, capsys).splitlines()
    assert "  tail           3 samples in 2 commits after the client's end, the last 3.2 s after it" in lines
    assert "  self-check     4 of 6 samples checked; 0 waiting, 0 in the pass under way, 1 skipped for load" in lines
    lines = _status(level, capsys).splitlines()
    assert not [ln for ln in lines if ln.startswith("  tail")]
    assert "  after end      1 sample in 1 commit after the client's end, the last 0.1 s after it" in lines
