#!/bin/bash
# The no-op site run of two or more commits side by side on the converged lab (docs/benchmarks.md): each commit
# in its own worktree at a fixed commit, alternating, ROUNDS rounds. A worktree needs the lab's state linked:
#   git worktree add /tmp/base <commit> && ln -s "$PWD/.lab" /tmp/base/.lab
#   scripts/noop-side-by-side.sh 2 /tmp/base /tmp/new
# Each run is `site.yml` and `report.yml` in one ansible-playbook, as `make lab` runs them; logs in
# ${NOOP_LOGS:-/tmp/noop-side-by-side}/<worktree>-<round>.log (scripts/profile-tasks.py reads them). Runs of
# different code put back each other's node-side copies (changed= says so): compare them as ratios.
set -euo pipefail
if [ $# -lt 2 ]; then
  echo "usage: $0 ROUNDS WORKTREE [WORKTREE...]" >&2
  exit 2
fi
rounds=$1
shift
ansible_playbook=$(dirname "$(readlink -f "$0")")/../.venv/bin/ansible-playbook
logs=${NOOP_LOGS:-/tmp/noop-side-by-side}
mkdir -p "$logs"
for round in $(seq "$rounds"); do
  for dir in "$@"; do
    dir=$(readlink -f "$dir")
    log="$logs/$(basename "$dir")-$round.log"
    start=$(date +%s.%N)
    rc=0
    (cd "$dir" && ANSIBLE_CONFIG="$dir/ansible.cfg" "$ansible_playbook" -i inventories/lab/hosts.yml \
      playbooks/site.yml playbooks/report.yml) > "$log" 2>&1 || rc=$?
    end=$(date +%s.%N)
    printf '%s round %s %s: %.1f s rc=%s %s\n' "$(date +%H:%M:%S)" "$round" "$(basename "$dir")" \
      "$(echo "$end - $start" | bc)" "$rc" "$(grep -E '^gpu-node' "$log" | grep -o 'changed=[0-9]*' | tr '\n' ' ')"
  done
done
