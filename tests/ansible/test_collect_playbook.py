"""playbooks/collect.yml on this machine: it pulls each host's output with rsync (the manifest first,
then the samples) into a staging directory per host and collects them into one verified set; run
again it changes nothing; a copy damaged in transit is pulled again by checksum; a host refused or
not pulled stops the play naming it, after the others are collected. The hosts here are reached
without SSH (ansible_connection local); over SSH only rsync's source differs (user@host:path)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from hsextract.output.manifest import iter_entries, read_header, verify_entry
from support import ansiballz_cache
from support.fleet import make_fleet, three_hosts
from support.head_model import write_head_model

REPO = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def ansible_bin(rsync: bool = True) -> Path:
    """The controller's Ansible; skip where it (or rsync, for a play that pulls) is missing."""
    bin_dir = os.environ.get("HSEXTRACT_ANSIBLE_BIN")
    if not bin_dir or not os.environ.get("HSEXTRACT_PYTHON"):
        pytest.skip("$HSEXTRACT_ANSIBLE_BIN / $HSEXTRACT_PYTHON are not set (make test sets them)")
    if rsync and shutil.which("rsync") is None:
        pytest.skip("rsync is not installed (the collector needs it to pull the hosts' outputs)")
    return Path(bin_dir)


def play(tmp_path: Path, hosts: dict[str, Path], **extra) -> subprocess.CompletedProcess:
    bin_dir = ansible_bin(rsync=not str(next(iter(hosts.values()))).startswith("s3://"))
    controller_python = str(bin_dir / "python")
    inventory = {
        "all": {
            "children": {
                "hsextract": {
                    "hosts": {
                        name: {"ansible_connection": "local", "hsextract_output_dir": str(path)}
                        for name, path in hosts.items()
                    }
                },
                "collector": {"hosts": {"localhost": {"ansible_connection": "local"}}},
            },
            "vars": {"ansible_python_interpreter": controller_python},
        }
    }
    (tmp_path / "fleet.yml").write_text(yaml.safe_dump(inventory))
    variables = {
        "collect_collector": "collector",
        "collect_into": str(tmp_path / "collected"),
        "hsextract_python": os.environ["HSEXTRACT_PYTHON"],
        "collect_draft_vocab_sizes": [16],
        **extra,
    }
    env = ansiballz_cache.with_cache({**os.environ, "ANSIBLE_NOCOLOR": "1", "ANSIBLE_LOCALHOST_WARNING": "0"})
    return subprocess.run(
        [
            str(bin_dir / "ansible-playbook"),
            "-i",
            str(tmp_path / "fleet.yml"),
            "playbooks/collect.yml",
            "-e",
            json.dumps(variables),
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_the_play_pulls_every_host_and_collects_them_fetching_a_damaged_copy_again_then_changes_nothing(tmp_path):
    fleet = make_fleet(tmp_path / "hosts", "speculators", three_hosts(), 30)
    src = fleet.hosts["b"] / "hidden_states" / "hs_3.safetensors"
    damaged = tmp_path / "collected-staging" / "b" / "hidden_states" / "hs_3.safetensors"
    damaged.parent.mkdir(parents=True)
    data = bytearray(src.read_bytes())
    data[200] ^= 0x40
    damaged.write_bytes(bytes(data))  # damaged in transit: same size and time, which rsync's quick check trusts
    st = src.stat()
    os.utime(damaged, ns=(st.st_atime_ns, st.st_mtime_ns))
    r = play(tmp_path, fleet.hosts, collect_final=True)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
    assert re.search(r"TASK \[Pull again, by checksum, [^\n]*\nchanged: \[localhost\] => \(item=b\)", r.stdout)
    assert re.search(r"TASK \[Collect what was fetched anew\.\] \**\nchanged: \[localhost\]", r.stdout)
    assert "fleet: 29 accepted = 27 in the set + 1 failed + 1 quarantined" in r.stdout
    into = tmp_path / "collected"
    assert sorted(e.dataset_index for e in iter_entries(into)) == sorted(fleet.samples)
    assert all(verify_entry(into, e) is None for e in iter_entries(into))
    staged = tmp_path / "collected-staging"
    assert sorted(p.name for p in staged.iterdir()) == ["a", "b", "c"]
    assert not list(staged.glob("*/quarantine/*/states.safetensors")), "quarantined states are not pulled"
    e = next(iter(iter_entries(into)))
    assert (
        os.stat(into / e.file).st_ino
        == os.stat(staged / e.host / f"hidden_states/hs_{e.host_index}.safetensors").st_ino
    ), "the staged copy is linked into the set"
    again = play(tmp_path, fleet.hosts, collect_final=True)
    assert again.returncode == 0 and "changed=0" in again.stdout, again.stdout[-3000:]


def test_fp8_hosts_are_collected_as_verified_specforge_files_when_the_play_is_asked_to(tmp_path):
    fleet = make_fleet(tmp_path / "hosts", "speculators", three_hosts(), 12, precision="fp8")
    model = tmp_path / "model"
    write_head_model(model, vocab=100)
    r = play(
        tmp_path,
        fleet.hosts,
        collect_final=True,
        collect_to_bf16=True,
        collect_to_bf16_format="specforge",
        collect_to_bf16_model=str(model),
    )
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
    into = tmp_path / "collected"
    header = read_header(into)
    assert (header.format, header.final_hidden, header.precision) == ("specforge", "post_norm", "bf16")
    entries = list(iter_entries(into))
    assert sorted(e.dataset_index for e in entries) == sorted(fleet.samples)
    assert all(verify_entry(into, e) is None for e in entries)


def test_a_host_of_another_run_and_one_not_pulled_stop_the_play_naming_each_after_the_others_are_collected(tmp_path):
    fleet = make_fleet(tmp_path / "hosts", "speculators", three_hosts(), 30)
    header = json.loads((fleet.hosts["b"] / "manifest.json").read_text())
    (fleet.hosts["b"] / "manifest.json").write_text(json.dumps({**header, "run_id": "0badc0de"}))
    shutil.rmtree(fleet.hosts["c"])  # unreachable, as far as rsync can tell
    r = play(tmp_path, fleet.hosts)
    assert r.returncode != 0
    assert f'Could not pull c: rsync: [sender] change_dir "{fleet.hosts["c"]}" failed' in r.stdout
    assert "hsextract collect exited 3" in r.stdout
    assert "run identity is '0badc0de', expected 'c011ec70' (as host a has it)" in r.stdout
    assert sorted(e.dataset_index for e in iter_entries(tmp_path / "collected")) == [
        x for x in fleet.samples if x % 3 == 0
    ]


def test_a_run_into_a_bucket_is_collected_in_place_and_verified_and_an_object_altered_since_fails_the_play_naming_it(
    tmp_path,
):
    from support.bucket_sets import drain_fleet, published, target
    from support.s3_server import WeedServer

    ansible_bin(rsync=False)  # nothing is pulled: the server copies
    weed = WeedServer(tmp_path / "weed-data").start()
    try:
        bucket = weed.new_bucket()
        creds = weed.credentials_file(tmp_path / "s3.credentials")
        staged = drain_fleet(weed, bucket, creds, tmp_path / "fleet")
        settings = {
            "hsextract_s3_endpoint": weed.endpoint,
            "hsextract_s3_credentials_src": str(creds),
            "collect_work_dir": str(tmp_path / "set-work"),
            "collect_into": f"s3://{bucket}/run/set",
        }
        hosts = {"a": f"s3://{bucket}/run", "b": f"s3://{bucket}/run"}
        r = play(tmp_path, hosts, **settings)
        assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
        assert f"collected {len(staged)} new samples into s3://{bucket}/run/set" in r.stdout, r.stdout[-3000:]
        assert f"verified {len(staged)}/{len(staged)} samples" in r.stdout, r.stdout[-3000:]
        entries = published(target(weed, bucket, "run/set", creds))
        assert [e.dataset_index for e in entries] == sorted(staged)
        assert weed.secret_key not in r.stdout + r.stderr

        altered = entries[3]  # its bytes changed in the bucket after the collect, its size kept
        key = f"run/set/{altered.file}"
        data = bytearray(weed.client().get_object(Bucket=bucket, Key=key)["Body"].read())
        data[-1] ^= 0x01
        weed.client().put_object(Bucket=bucket, Key=key, Body=bytes(data))
        again = play(tmp_path, hosts, **settings)
        assert again.returncode != 0, again.stdout[-3000:]
        said = f"The collected set s3://{bucket}/run/set failed verification"
        assert said in again.stdout, again.stdout[-3000:]
        # Put again by hand, the object no longer carries the line its drain wrote beside it.
        bad = f"BAD 3 ({altered.rid}): s3://{bucket}/run/set/{altered.file}: carries no manifest line of hsextract's"
        assert bad in again.stdout, again.stdout[-3000:]
    finally:
        weed.stop()
