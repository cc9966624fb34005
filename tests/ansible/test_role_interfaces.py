"""Each role declares what it reads, and the service units have one set of handlers.

A role's meta/argument_specs.yml is checked by Ansible when the role starts, so a variable declared
there fails fast when it is missing or of the wrong type; one that a role reads without declaring
it fails late, or renders as a wrong unit file. The run's shared settings (hsextract_*) are set
by the hsextract role and read by the others, so each role declares those it reads too.

The variables a role reads are found by parsing its Jinja (tasks, handlers, templates) with
Jinja's own parser, not by pattern: names a template sets itself are not reads, and private names
(``role__x``: registered results, task vars) are the role's own business.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from jinja2 import Environment, nodes

REPO = Path(__file__).resolve().parents[2]
ROLES = REPO / "roles"
ROLE_NAMES = sorted(p.name for p in ROLES.iterdir() if p.is_dir())
SERVICE_ROLES = ("sglang_server", "drain_daemon", "extraction", "regeneration")
CONDITIONS = {"when", "that", "until", "changed_when", "failed_when"}  # bare Jinja expressions in a task
JINJA = Environment(extensions=["jinja2.ext.do", "jinja2.ext.loopcontrols"])


def names_read(template: str) -> set[str]:
    """The variables a Jinja template reads, less those it assigns itself ({% set %}, loop targets)."""
    tree = JINJA.parse(template)
    assigned = {n.name for n in tree.find_all(nodes.Name) if n.ctx in ("store", "param")}
    return {n.name for n in tree.find_all(nodes.Name) if n.ctx == "load"} - assigned


def _templates_in(node: object, key: str | None = None) -> Iterator[str]:
    """Every Jinja template of a parsed task file (conditions are expressions without braces)."""
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _templates_in(v, k)
    elif isinstance(node, list):
        for v in node:
            yield from _templates_in(v, key)
    elif isinstance(node, str):
        if key in CONDITIONS and "{{" not in node:
            yield "{{ " + node + " }}"
        elif "{{" in node or "{%" in node:
            yield node


def public_reads(role: str) -> set[str]:
    """The public variables (``hsextract_*`` and the role's own prefix) the role's code reads."""
    path = ROLES / role
    templates = [
        t
        for f in sorted([*path.glob("tasks/*.yml"), *path.glob("handlers/*.yml")])
        for t in _templates_in(yaml.safe_load(f.read_text()))
    ]
    templates += [f.read_text() for f in sorted(path.glob("templates/*.j2"))]
    public = re.compile(rf"^(hsextract|{role})_(?!_)")
    return {name for t in templates for name in names_read(t) if public.match(name)}


def declared(role: str) -> dict[str, dict]:
    specs = yaml.safe_load((ROLES / role / "meta" / "argument_specs.yml").read_text())
    return specs["argument_specs"]["main"].get("options") or {}


def _yaml_keys(path: Path) -> set[str]:
    return set(yaml.safe_load(path.read_text()) or {}) if path.is_file() else set()


def set_by_hsextract_role() -> set[str]:
    """What the hsextract role sets: its defaults, its vars and the facts its tasks set."""
    role = ROLES / "hsextract"
    facts = {
        name
        for f in role.glob("tasks/*.yml")
        for task in yaml.safe_load(f.read_text()) or []
        for name in (task.get("ansible.builtin.set_fact") or {})
    }
    return _yaml_keys(role / "defaults" / "main.yml") | _yaml_keys(role / "vars" / "main.yml") | facts


def test_the_reads_are_found_in_tasks_conditions_and_templates():
    assert {"hsextract_output_local", "hsextract_rid_prefix"} <= public_reads("smoke_test")  # a task and a condition
    assert {"hsextract_capture_package", "sglang_server_profile"} <= public_reads("sglang_server")  # the unit
    assert "sglang_server__health" not in public_reads("sglang_server")  # private: registered by the role


@pytest.mark.parametrize("role", ROLE_NAMES)
def test_every_public_variable_a_role_reads_is_declared_in_its_argument_specs(role):
    own = set(declared(role)) | (set_by_hsextract_role() if role == "hsextract" else set())
    undeclared = sorted(public_reads(role) - own)
    assert not undeclared, f"roles/{role} reads {undeclared} without declaring them in meta/argument_specs.yml"


@pytest.mark.parametrize("role", [r for r in ROLE_NAMES if r != "hsextract"])
def test_every_shared_setting_a_role_declares_is_one_the_hsextract_role_sets_with_its_type(role):
    shared = {name: spec for name, spec in declared(role).items() if name.startswith("hsextract_")}
    unknown = sorted(set(shared) - set_by_hsextract_role())
    assert not unknown, f"roles/{role} declares {unknown}, which the hsextract role does not set"
    theirs = declared("hsextract")
    differ = {
        name: (spec["type"], theirs[name]["type"])
        for name, spec in shared.items()
        if name in theirs and spec["type"] != theirs[name]["type"]
    }
    assert not differ, f"roles/{role} declares these with another type than roles/hsextract (its, theirs): {differ}"


def _notified_topics() -> set[str]:
    files = [*ROLES.glob("*/tasks/*.yml"), *(REPO / "playbooks").glob("*.yml"), REPO / "extract.yml"]
    topics: set[str] = set()

    def walk(node: object) -> None:
        if isinstance(node, dict):
            notify = node.get("notify")
            topics.update([notify] if isinstance(notify, str) else notify or [])
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    for f in files:
        walk(yaml.safe_load(f.read_text()))
    return topics


def test_the_service_units_have_one_handler_set_that_every_notification_reaches():
    assert sorted(p.parent.parent.name for p in ROLES.glob("*/handlers/main.yml")) == ["service_handlers"]
    for role in SERVICE_ROLES:
        deps = yaml.safe_load((ROLES / role / "meta" / "main.yml").read_text())["dependencies"]
        assert {"role": "service_handlers"} in deps, f"roles/{role} does not depend on the service_handlers role"
    handlers = yaml.safe_load((ROLES / "service_handlers" / "handlers" / "main.yml").read_text())
    listened = {topic for h in handlers for topic in h["listen"]}
    notified = _notified_topics()
    assert {"server unit changed", "capture changed", "package changed", "units removed"} <= notified
    assert notified <= listened, f"notified without a handler: {sorted(notified - listened)}"


def test_a_restart_is_a_try_restart_of_a_unit_that_was_running():
    handlers = yaml.safe_load((ROLES / "service_handlers" / "handlers" / "main.yml").read_text())
    restarts = [h for h in handlers if h["name"].startswith("Restart ")]
    assert len(restarts) == len(SERVICE_ROLES)
    for h in restarts:
        argv = h["ansible.builtin.command"]["argv"]
        assert argv[:2] == ["systemctl", "try-restart"], h["name"]
        assert "['active', 'activating']" in h["when"], h["name"]  # otherwise skipped: reported as unchanged
        assert "package changed" in h["listen"], h["name"]
