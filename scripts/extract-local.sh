#!/usr/bin/env bash
# extract-local.sh -- `make extract`: run `ansible-playbook extract.yml -e wait=true` on this machine
# with the embedded defaults (inventory/local.yml: tiny model, bundled dataset, CPU without a GPU),
# and print where the training set is. The tiny model is generated beside the training set, so the
# model its manifest names is still there after the run.
#
# Where systemd is the init system, the play configures this machine directly (as root). Where it
# is not (CI VMs, containers), the play runs inside the systemd sandbox (scripts/sdbox.sh) and says
# so; the training set is written to a host directory bound into the sandbox, so it outlives it.
#
# env: HSEXTRACT_ANSIBLE_BIN  bin dir of the controller venv (requirements/controller.txt)   [required]
#      HSEXTRACT_VENV         the ml-env venv (requirements/ml-env.lock)                      [required]
#      HSEXTRACT_OUTPUT       the training set's directory (default: .work/output in the repository)
#      HSEXTRACT_MODEL        the demo model's directory (default: model/ beside the training set)
#      SDBOX_SHM              size of the sandbox's /dev/shm (default 2g)
# Extra arguments go to ansible-playbook (e.g. -e hsextract_format=specforge).
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD
BIN=${HSEXTRACT_ANSIBLE_BIN:?set HSEXTRACT_ANSIBLE_BIN to the controller venv bin dir (make controller builds it)}
: "${HSEXTRACT_VENV:?set HSEXTRACT_VENV to the ml-env venv (make venv builds it)}"
OUT=${HSEXTRACT_OUTPUT:-$REPO/.work/output}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
MODEL=${HSEXTRACT_MODEL:-$(dirname "$OUT")/model}
mkdir -p "$MODEL"
MODEL=$(cd "$MODEL" && pwd)
args=(extract.yml -e wait=true -e "hsextract_output_dir=$OUT" -e "hsextract_model_path=$MODEL" "$@")

if [ -d /run/systemd/system ]; then
  [ "$(id -u)" = 0 ] || { echo "extract-local.sh: the play installs systemd units; run it as root" >&2; exit 1; }
  "$BIN/ansible-playbook" "${args[@]}"
else
  echo "PID 1 is not systemd on this machine: running the play inside a systemd sandbox (scripts/sdbox.sh)."
  echo "The services stop with the sandbox at the end; the training set stays in $OUT."
  export SDBOX_NAME="hsextract-local-$$" SDBOX_NET=1 SDBOX_SHM="${SDBOX_SHM:-2g}"
  # Bound read-write at the same paths: what the play writes there outlives the sandbox.
  SDBOX_BINDS=$REPO
  for dir in "$OUT" "$MODEL"; do
    case $dir/ in "$REPO"/*) ;; *) SDBOX_BINDS="$SDBOX_BINDS $dir" ;; esac
  done
  export SDBOX_BINDS
  trap 'scripts/sdbox.sh stop' EXIT
  scripts/sdbox.sh start >/dev/null
  scripts/sdbox.sh exec env HSEXTRACT_VENV="$HSEXTRACT_VENV" "$BIN/ansible-playbook" "${args[@]}"
fi
echo "Training set: $OUT (model: $MODEL)"
