"""Overriding paths of the roles cannot make a service's unit and its process disagree.

Each service's process reads its paths from the run config (``hsextract_config_file``, written by
roles/hsextract) or, for the capture inside the server, from the rendered capture package; its unit
grants the paths it may write (``ReadWritePaths=``) and binds those that its private /tmp would
hide. Every path-like variable of every role's defaults is overridden at once, each to a value of
its own (so a unit built from one variable and a process reading another show two different paths),
the run config, the four units and the capture package are rendered by Ansible from the roles' own
templates and defaults, and each unit is checked against what its process will open.
Runs on the host: only files in a temporary directory are written.
"""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import yaml
from support.role_play import playbook, validate

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
ROLES = REPO / "roles"
SERVICE_ROLES = ("hsextract", "ml_env", "capture_patch", "sglang_server", "drain_daemon", "extraction", "regeneration")
UNITS = {
    "server": ("sglang_server", "hsextract-server.service.j2"),
    "drain": ("drain_daemon", "hsextract-drain.service.j2"),
    "client": ("extraction", "hsextract-extract.service.j2"),
    "regen": ("regeneration", "hsextract-regenerate.service.j2"),
}
PRIVATE_TMP = re.compile(r"^/(var/)?tmp(/|$)")


def path_variables() -> list[str]:
    """Every variable of the roles' defaults that names a path, plus the server's address."""
    names = []
    for role in SERVICE_ROLES:
        defaults = yaml.safe_load((ROLES / role / "defaults" / "main.yml").read_text()) or {}
        names += [k for k in defaults if re.search(r"_(dir|path|file|venv)$", k)]
    return sorted({*names, "hsextract_dataset", "hsextract_host", "hsextract_port", "hsextract_capture_package"})


def override_value(name: str, tmp: Path) -> object:
    if name == "hsextract_port":
        return 31999
    if name == "hsextract_host":
        return "0.0.0.0"
    if name == "hsextract_capture_package":
        return "my_capture"
    if name in ("hsextract_state_dir", "hsextract_capture_dir", "hsextract_model_path"):
        return str(tmp / "override" / name)  # written (the capture package) or read (the model) on this host
    return f"/srv/override/{name}"  # only rendered into files, never created


def write_model(path: Path) -> None:
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(
        json.dumps({"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 8, "hidden_size": 64})
    )


def render_play(tmp: Path) -> list[dict]:
    """One play; each inventory host is a case, rendering into cases/<host>/ with its own overrides."""
    out = str(tmp / "cases" / "{{ inventory_hostname }}")
    defaults = [str(ROLES / r / "defaults" / "main.yml") for r in SERVICE_ROLES if r != "capture_patch"]
    renders = [{"src": str(ROLES / "hsextract" / "templates" / "run.json.j2"), "dest": f"{out}/run.json"}]
    renders += [
        {"src": str(ROLES / role / "templates" / name), "dest": f"{out}/{unit}.service"}
        for unit, (role, name) in UNITS.items()
    ]
    return [
        {
            "name": "Render the run config, the units and the capture package of every case.",
            "hosts": "all",
            "gather_facts": False,
            "vars_files": [*defaults, str(tmp / "base.yml")],
            "handlers": [
                {
                    "name": "Note the capture change.",
                    "ansible.builtin.debug": {"msg": "capture changed"},
                    "listen": "capture changed",
                }
            ],
            "tasks": [
                # include_vars outranks the vars files: the case's overrides win over the roles' defaults.
                {
                    "name": "Load the case's overrides.",
                    "ansible.builtin.include_vars": str(tmp / "override-{{ inventory_hostname }}.yml"),
                },
                {
                    "name": "Create the case's directory.",
                    "ansible.builtin.file": {"path": out, "state": "directory", "mode": "0755"},
                },
                {
                    "name": "Render the run config and the units.",
                    "ansible.builtin.template": {"src": "{{ item.src }}", "dest": "{{ item.dest }}", "mode": "0644"},
                    "loop": renders,
                },
                {"name": "Render the capture package.", "ansible.builtin.include_role": {"name": "capture_patch"}},
                {
                    "name": "Record where the play puts what the processes read.",
                    "ansible.builtin.copy": {
                        "dest": f"{out}/facts.json",
                        "mode": "0644",
                        "content": json.dumps(
                            {
                                "config_file": "{{ hsextract_config_file }}",
                                "python": "{{ hsextract_python }}",
                                "capture_dir": "{{ hsextract_capture_dir }}",
                                "package": "{{ hsextract_capture_package }}",
                                "dataset": "{{ hsextract_dataset }}",
                                "regenerate": "{{ hsextract_regenerate | bool }}",
                                "regenerated_dir": "{{ hsextract_regenerated_dir }}",
                            }
                        ),
                    },
                },
            ],
        }
    ]


def render_cases(tmp: Path, cases: dict[str, dict]) -> None:
    write_model(tmp / "model")
    (tmp / "base.yml").write_text(
        yaml.safe_dump(
            {
                "hsextract_on_cpu": True,
                "hsextract_model_path": str(tmp / "model"),
                "hsextract_dataset": "/srv/data/train.jsonl",
                "hsextract_format": "speculators",
            }
        )
    )
    hosts = {}
    for case, overrides in cases.items():
        if "hsextract_model_path" in overrides:
            write_model(Path(overrides["hsextract_model_path"]))
        # Each case renders its own capture package (into its own state directory unless overridden).
        (tmp / f"override-{case}.yml").write_text(
            yaml.safe_dump({"hsextract_state_dir": str(tmp / f"state-{case}"), **overrides})
        )
        hosts[case] = {}
    r = playbook(tmp, render_play(tmp), hosts)
    assert r.returncode == 0, r.stdout[-5000:] + r.stderr[-3000:]


def parse_unit(path: Path) -> dict[str, list[str]]:
    """Key -> values of a unit file (continuation lines joined, comments dropped)."""
    text = re.sub(r"\\\n\s*", " ", path.read_text())
    keys: dict[str, list[str]] = {}
    for line in text.splitlines():
        if "=" in line and not line.lstrip().startswith(("#", ";", "[")):
            key, value = line.split("=", 1)
            keys.setdefault(key.strip(), []).append(value.strip())
    return keys


class Unit:
    def __init__(self, path: Path):
        self.name = path.name
        self.keys = parse_unit(path)
        self.argv = shlex.split(self.keys["ExecStart"][0])
        self.env = dict(e.split("=", 1) for e in self.keys.get("Environment", []))

    def paths(self, key: str) -> set[str]:
        return {p.lstrip("-") for v in self.keys.get(key, []) for p in v.split()}

    def flag(self, name: str) -> str:
        return self.argv[self.argv.index(name) + 1]

    def can_write(self, path: str) -> bool:
        bound = not PRIVATE_TMP.match(path) or path in self.paths("BindPaths")
        return path in self.paths("ReadWritePaths") and bound

    def can_read(self, path: str) -> bool:
        return not PRIVATE_TMP.match(path) or path in self.paths("BindPaths") | self.paths("BindReadOnlyPaths")


def disagreements(case_dir: Path) -> list[str]:
    """What a unit grants or passes that its process would not find where it looks."""
    facts = json.loads((case_dir / "facts.json").read_text())
    run = json.loads((case_dir / "run.json").read_text())
    units = {name: Unit(case_dir / f"{name}.service") for name in UNITS}
    init = (Path(facts["capture_dir"]) / facts["package"] / "__init__.py").read_text()
    capture = json.loads(json.loads(re.search(r"CONFIG = json\.loads\((.*)\)\n", init).group(1)))
    problems = []

    def expect(ok: bool, what: str) -> None:
        if not ok:
            problems.append(what)

    for name in ("drain", "client"):
        u = units[name]
        expect(
            u.flag("--config") == facts["config_file"],
            f"{name}: reads {u.flag('--config')}, the play writes the run config to {facts['config_file']}",
        )
        for key in ("output", "dump_dir"):
            expect(u.can_write(run[key]), f"{name}: its process writes {key}={run[key]}, the unit does not let it")
        expect(u.can_read(run["model"]), f"{name}: its process reads the model {run['model']}, hidden by the unit")
        expect(u.can_write(u.env["HOME"]), f"{name}: HOME={u.env['HOME']} is not writable in the unit")
    expect(units["client"].can_read(run["dataset"]), f"client: the dataset {run['dataset']} is hidden by the unit")
    drain = units["drain"]
    asks = drain.flag("--selfcheck-server") if "--selfcheck-server" in drain.argv else None
    expect(
        asks == run["server"],
        f"drain: its self-check asks {asks} for the prompts' logprobs, the server is {run['server']}",
    )
    regen = units["regen"]
    expect(
        regen.flag("--dataset") == facts["dataset"] and regen.can_read(facts["dataset"]),
        f"regeneration: reads {regen.flag('--dataset')}, the dataset is {facts['dataset']} (readable: "
        f"{regen.can_read(facts['dataset'])})",
    )
    expect(
        regen.flag("--output") == facts["regenerated_dir"] and regen.can_write(facts["regenerated_dir"]),
        f"regeneration: writes {regen.flag('--output')}, granted {regen.paths('ReadWritePaths')}",
    )
    expect(regen.flag("--server") == run["server"], f"regeneration calls {regen.flag('--server')}, not {run['server']}")
    expect(regen.can_write(regen.env["HOME"]), f"regeneration: HOME={regen.env['HOME']} is not writable in the unit")
    if facts["regenerate"] == "True":
        expect(
            run["dataset"] == facts["regenerated_dir"] and "shard" not in run,
            f"with regeneration the client reads {run['dataset']} (shard {run.get('shard')}), "
            f"the regeneration writes {facts['regenerated_dir']}",
        )
    else:
        expect(
            run["dataset"] == facts["dataset"], f"the client reads {run['dataset']}, the dataset is {facts['dataset']}"
        )
    server = units["server"]
    expect(
        capture["dump_dir"] == run["dump_dir"],
        f"the capture writes to {capture['dump_dir']}, the drain and the client use {run['dump_dir']}",
    )
    expect(server.can_write(capture["dump_dir"]), f"server: the capture writes {capture['dump_dir']}, not granted")
    expect(
        capture["model_path"] == run["model"] == server.flag("--model-path"),
        f"model: capture {capture['model_path']}, run config {run['model']}, server {server.flag('--model-path')}",
    )
    pythonpath = server.env.get("PYTHONPATH", "")
    expect(
        facts["capture_dir"] in pythonpath.split(":") and server.can_read(facts["capture_dir"]),
        f"server: the capture package is rendered in {facts['capture_dir']}, not on its PYTHONPATH {pythonpath}",
    )
    expect(
        server.env.get("SGLANG_EXTERNAL_MODEL_PACKAGE") == facts["package"],
        f"server loads {server.env.get('SGLANG_EXTERNAL_MODEL_PACKAGE')}, the package is {facts['package']}",
    )
    expect(capture["rid_prefix"] == run["rid_prefix"], "the capture's rid prefix differs from the client's")
    expect(server.can_write(server.env["HOME"]), f"server: HOME={server.env['HOME']} is not writable in the unit")
    url = urlsplit(run["server"])
    expect(str(url.port) == server.flag("--port"), f"server listens on {server.flag('--port')}, the client calls {url}")
    expect(
        url.hostname in ("127.0.0.1", "::1", server.flag("--host")),
        f"server binds {server.flag('--host')}, the client calls {run['server']}",
    )
    expect(
        any(a.startswith(run["server"] + "/health") for a in shlex.split(server.keys["ExecStartPost"][0])),
        f"server: the start waits on {server.keys['ExecStartPost'][0]}, not on {run['server']}/health",
    )
    for name, u in units.items():
        expect(u.argv[0] == facts["python"], f"{name} runs {u.argv[0]}, hsextract is installed in {facts['python']}")
    for name in ("server", "drain"):
        expect(
            steps_naming(units[name], run["dump_dir"])
            == [
                [
                    facts["python"],
                    "-m",
                    "hsextract.ops.staging_root",
                    "--owner",
                    units[name].keys.get("User", ["root"])[0],
                    run["dump_dir"],
                ]
            ],
            f"{name}: the staging directory {run['dump_dir']} is not made (or refused) for the unit's user before "
            f"it starts: {units[name].keys.get('ExecStartPre')}",
        )
    return problems


def steps_naming(unit: Unit, path: str) -> list[list[str]]:
    """The unit's steps before its start (run as root: a leading '+') that name `path`, each as
    argv. ``install -d -o`` of the staging directory would give one another user made first to the
    service's user, with whatever was planted in it."""
    steps = [shlex.split(v.lstrip("+")) for v in unit.keys.get("ExecStartPre", [])]
    return [s for s in steps if path in s]


@pytest.fixture(scope="module")
def rendered(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("unit-paths")
    cases = {
        "defaults": {},
        "every-path-overridden": {name: override_value(name, tmp) for name in path_variables()},
        "under-tmp": {
            "hsextract_output_dir": str(tmp / "out"),
            "hsextract_dump_dir": "/var/tmp/hsx-dumps",
            "hsextract_dataset": str(tmp / "data.jsonl"),
        },
        "regenerate-under-tmp": {
            "hsextract_regenerate": True,
            "hsextract_regenerated_dir": str(tmp / "regen"),
            "hsextract_dataset": str(tmp / "data.jsonl"),
            "hsextract_shard": "1/2",
        },
    }
    render_cases(tmp, cases)
    return tmp, cases


def test_every_path_variable_of_the_roles_is_overridden_here():
    names = path_variables()
    assert {"hsextract_output_dir", "hsextract_dump_dir", "hsextract_model_path", "hsextract_capture_dir"} <= set(names)
    assert len(names) >= 12, names


@pytest.mark.parametrize("case", ["defaults", "every-path-overridden", "under-tmp", "regenerate-under-tmp"])
def test_an_override_reaches_both_the_unit_and_its_process(rendered, case):
    tmp, cases = rendered
    assert disagreements(tmp / "cases" / case) == [], f"with {cases[case]}"


def test_paths_under_tmp_are_bound_into_the_services_private_tmp(rendered):
    tmp, _ = rendered
    units = {name: Unit(tmp / "cases" / "under-tmp" / f"{name}.service") for name in UNITS}
    assert {str(tmp / "out"), "/var/tmp/hsx-dumps"} <= units["drain"].paths("BindPaths")
    assert str(tmp / "data.jsonl") in units["client"].paths("BindReadOnlyPaths")
    assert "BindPaths" not in parse_unit(tmp / "cases" / "every-path-overridden" / "drain.service")


def test_the_drain_role_refuses_a_selfcheck_server_that_is_not_a_url(tmp_path):
    """Refused before the unit is installed (check mode here), naming the variable and its value."""
    r = validate(tmp_path, "drain_daemon", {"drain_daemon_selfcheck_server": "127.0.0.1:30000"})
    assert r.returncode != 0
    assert "drain_daemon_selfcheck_server=127.0.0.1:30000: give the server's URL" in r.stdout, r.stdout[-3000:]
    assert "Install the drain daemon unit" not in r.stdout


BUCKET_SECRET = "wJalrXUtnFEMI-not-a-real-secret"


def test_a_bucket_output_renders_the_hosts_prefix_its_work_directory_and_only_the_credentials_path(tmp_path):
    creds = tmp_path / "s3.credentials"
    creds.write_text(f"[default]\naws_access_key_id = AKIDEXAMPLE\naws_secret_access_key = {BUCKET_SECRET}\n")
    creds.chmod(0o600)
    render_cases(
        tmp_path,
        {
            "gpu-7": {
                "hsextract_output_dir": "s3://sets/run7",
                "hsextract_s3_endpoint": "http://10.0.0.5:8333",
                "hsextract_s3_credentials_src": str(creds),
            }
        },
    )
    case = tmp_path / "cases" / "gpu-7"
    config = json.loads((case / "run.json").read_text())
    work = "/var/lib/hsextract/objectstore/sets/run7/gpu-7"
    assert config["output"] == "s3://sets/run7/gpu-7"
    assert config["work_dir"] == work
    assert config["s3_endpoint"] == "http://10.0.0.5:8333"
    assert config["s3_credentials"] == "/etc/hsextract/s3.credentials"
    for unit in ("drain", "client"):
        text = (case / f"{unit}.service").read_text()
        assert BUCKET_SECRET not in text and "AKIDEXAMPLE" not in text
        rw = Unit(case / f"{unit}.service").keys["ReadWritePaths"][0].split()
        assert f"-{work}" in rw and not any("s3://" in p for p in rw)
    assert BUCKET_SECRET not in (case / "run.json").read_text()
